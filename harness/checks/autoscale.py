"""The autoscaler (``--autoscaler-config``, relax/core/autoscaler.py) followed its policy.

The run's ``autoscaler_start`` event holds the parsed config; every ``autoscale_decision`` event holds the
signal values, the fleet size, the loop's time ``t`` and the previous scale. The check:

* replays the pure policy (relax/utils/autoscaler/policy.py) on each decision's own inputs: same action,
  count and cause;
* rebuilds the previous scale from the ``autoscale_result`` events (a scale's cooldown runs from its end)
  and finds it equal to what the decision saw; no scale starts within the previous one's cooldown;
* finds the fleet inside ``[min_engines, max_engines]`` after every scale (and at the end: ``fleet_final``),
  and no scale that would take it outside;
* finds no repeated hold (a hold is reported only when its cause changes);
* finds at least ``min_out`` scale-outs and ``min_in`` scale-ins that ended without error.
"""

from __future__ import annotations

from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register
from relax.utils.autoscaler.config import AutoscalerConfig
from relax.utils.autoscaler.policy import Action, LastScale, Signals, decide


@register("autoscale_policy")
class AutoscalePolicy(CheckParams):
    kind: Literal["autoscale_policy"] = "autoscale_policy"
    run: str | None = None
    min_out: int = 0
    min_in: int = 0

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        start = run.events_named("autoscaler_start")
        if not start:
            return self.result(False, "no autoscaler_start event: run with --autoscaler-config")
        cfg = AutoscalerConfig.model_validate(start[0]["config"])
        problems = self._replay(cfg, [e for e in run.events if e.get("event") in ("autoscale_decision",
                                                                                     "autoscale_result")])
        results = run.events_named("autoscale_result")
        done = {a: sum(r["action"] == a and not r.get("error") for r in results) for a in ("out", "in")}
        for action, want in (("out", self.min_out), ("in", self.min_in)):
            if done[action] < want:
                problems.append(f"{done[action]} scale-{action}s ended without error (expected >= {want})")
        final = run.events_named("fleet_final")
        if final and not cfg.min_engines <= len(final[-1].get("workers", [])) <= cfg.max_engines:
            problems.append(f"the run ended with {len(final[-1]['workers'])} engines, outside "
                            f"[{cfg.min_engines}, {cfg.max_engines}]")
        decisions = run.events_named("autoscale_decision")
        details = {"decisions": [(d["t"], d["action"], d["count"], d["code"]) for d in decisions][:50],
                   "scaled": done, "problems": problems[:20]}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        return self.result(True, f"{len(decisions)} decisions follow the policy ({done['out']} out, {done['in']} in), "
                                 f"fleet within [{cfg.min_engines}, {cfg.max_engines}], cooldowns kept",
                           details=details)

    @staticmethod
    def _replay(cfg: AutoscalerConfig, events: list[dict]) -> list[str]:
        problems: list[str] = []
        last: LastScale | None = None
        previous: dict | None = None
        for ev in events:
            if ev["event"] == "autoscale_result":
                last = LastScale(Action(ev["action"]), float(ev["t"]))
                if not ev.get("error") and not cfg.min_engines <= int(ev["engines"]) <= cfg.max_engines:
                    problems.append(f"t={ev['t']}: scale-{ev['action']} left {ev['engines']} engines")
                continue
            at = f"t={ev['t']}"
            seen = ev.get("last_scale")
            if (seen is None) != (last is None) or (seen and (seen["action"], seen["t"]) != (last.action.value, last.at)):
                problems.append(f"{at}: the decision saw previous scale {seen}, the results say {last}")
            want = decide(cfg, Signals(**ev["signals"]), int(ev["engines"]), last, float(ev["t"]))
            if (want.action.value, want.count, want.code) != (ev["action"], ev["count"], ev["code"]):
                problems.append(f"{at}: decided {ev['action']} {ev['count']} ({ev['code']}); the policy says "
                                f"{want.action.value} {want.count} ({want.code}: {want.reason})")
            if ev["action"] != "hold":
                engines = int(ev["engines"]) + (ev["count"] if ev["action"] == "out" else -ev["count"])
                if cfg.min_engines <= int(ev["engines"]) <= cfg.max_engines and \
                        not cfg.min_engines <= engines <= cfg.max_engines:
                    problems.append(f"{at}: scale-{ev['action']} of {ev['count']} would leave {engines} engines")
                if last is not None:
                    cooldown = cfg.scale_out_cooldown_s if last.action is Action.OUT else cfg.scale_in_cooldown_s
                    if float(ev["t"]) - last.at < cooldown:
                        problems.append(f"{at}: scale-{ev['action']} {float(ev['t']) - last.at:.1f} s after the last "
                                        f"scale-{last.action}, within its {cooldown:g} s cooldown")
            elif previous is not None and previous["action"] == "hold" and previous["code"] == ev["code"]:
                problems.append(f"{at}: hold ({ev['code']}) reported twice in a row")
            previous = ev
        return problems
