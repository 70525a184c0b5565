"""Fault outcomes: the run recovered within N restarts, or failed fast with the expected message."""

from __future__ import annotations

import re
from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register


@register("fault_outcome")
class FaultOutcome(CheckParams):
    kind: Literal["fault_outcome"] = "fault_outcome"
    run: str | None = None
    expect: Literal["recovered", "failed_fast"]
    max_restarts: int = 1  # recovered: at most this many ``restart`` events
    min_restarts: int = 0  # recovered: at least this many (1 proves the fault was noticed)
    message: str | None = None  # failed_fast: regex searched in run.json["error"]
    within_s: float | None = None  # failed_fast: from the fault (or start) to the end of the run
    require_fault_event: bool = True  # a fault_injected / fault_detected event must exist
    # recovered: at least this many of each outcome of the HTTP fault proxies (events.jsonl proxy_stats,
    # summed over proxies), e.g. {errors: 1, dropped: 1, delayed: 1}: the faults really hit requests
    min_injected: dict[str, int] = {}

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        injected = run.events_named("fault_injected")
        detected = run.events_named("fault_detected")
        restarts = run.events_named("restart")
        details = {"status": run.status, "error": run.error, "injected": len(injected),
                   "detected": len(detected), "restarts": len(restarts)}
        if self.require_fault_event and not (injected or detected):
            return self.result(False, "no fault_injected or fault_detected event: the fault never happened",
                               details=details)
        if self.expect == "recovered":
            return self._recovered(run, restarts, details)
        return self._failed_fast(run, injected, details)

    def _recovered(self, run, restarts, details) -> CheckResult:
        if run.status != "completed":
            return self.result(False, f"fault not survived: run.json status {run.status!r}, error {run.error!r} "
                                      f"after {len(restarts)} restart(s)", details=details)
        if len(restarts) > self.max_restarts:
            return self.result(False, f"recovered only after {len(restarts)} restarts > allowed {self.max_restarts}",
                               details=details)
        if len(restarts) < self.min_restarts:
            return self.result(False, f"no recovery recorded: {len(restarts)} restart event(s), "
                                      f"expected at least {self.min_restarts}", details=details)
        injected: dict[str, int] = {}
        for event in run.events_named("proxy_stats"):
            for key, count in (event.get("stats") or {}).items():
                injected[key] = injected.get(key, 0) + int(count)
        if self.min_injected:
            details["proxy_stats"] = injected
            short = {k: injected.get(k, 0) for k, want in self.min_injected.items() if injected.get(k, 0) < want}
            if short:
                return self.result(False, f"the proxy injected too little to prove anything: {short} (wanted at "
                                          f"least {self.min_injected})", details=details)
        num = (run.run.get("config") or {}).get("num_rollout")
        steps = run.steps()
        if num and (not steps or steps[-1] < int(num) - 1):
            last = steps[-1] if steps else None
            return self.result(False, f"run says completed but its last step is {last}, expected {int(num) - 1}",
                               details=details)
        survived = f", through proxy faults {injected}" if self.min_injected else ""
        return self.result(True, f"recovered after {len(restarts)} restart(s) (<= {self.max_restarts}) and "
                                 f"completed {len(steps)} steps{survived}", details=details)

    def _failed_fast(self, run, injected, details) -> CheckResult:
        if run.status != "failed":
            return self.result(False, f"expected a fast failure, run.json status is {run.status!r}", details=details)
        error = run.error or ""
        if self.message and not re.search(self.message, error):
            return self.result(False, f"failed with error {error!r}, which does not match {self.message!r}",
                               details=details)
        if self.within_s is not None:
            start = injected[0]["time"] if injected else run.run.get("start_time")
            end = run.run.get("end_time") or max((e.get("time", 0) for e in run.events), default=None)
            if start is None or end is None:
                return self.result(False, "cannot time the failure: no start/end time recorded", details=details)
            took = float(end) - float(start)
            details["took_s"] = took
            if took > self.within_s:
                return self.result(False, f"failed, but slowly: {took:.1f}s > {self.within_s:g}s", details=details)
        return self.result(True, f"failed fast as expected: {error!r}", details=details)
