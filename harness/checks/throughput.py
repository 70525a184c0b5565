"""Throughput: one figure per scenario from wall time, judged against the machine class's stored baseline.

The figure is samples (or response tokens) per second over the steps after ``skip_steps`` warm-up steps,
timed between ``step_end`` events: ``sum(count of steps k+1..n) / (t_end(n) - t_end(k))``. The engine's
own ``perf/*`` metrics are not used: they time parts of a step, and two of them were one number twice.
The same measurement drives the stored baselines (`harness.baselines`) and the A/B gate (`harness.ab`).
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import Field

from harness import baselines
from harness.artifacts import RunArtifacts
from harness.checks.base import CheckContext, CheckParams, CheckResult, register
from harness.profiles import THROUGHPUT_MIN_TOLERANCE

COUNT_KEYS = {"samples": ("rollout/num_samples",), "tokens": ("rollout/num_samples", "rollout/response_len_mean")}


def _window_start(run: RunArtifacts, ends: dict[int, float], steps: list[int], skip_steps: int) -> float:
    """The end of the last warm-up step, or the first step's start when there is no warm-up."""
    if skip_steps:
        return ends[steps[skip_steps - 1]]
    starts = [float(e["time"]) for e in run.events_named("step_start") if e.get("step") == steps[0]]
    if not starts:
        raise ValueError(f"no step_start event for step {steps[0]}")
    return starts[-1]


def measure(run: RunArtifacts, unit: str, skip_steps: int, min_steps: int) -> dict[str, float]:
    """``{"value": per second, "steps": measured steps, "window_s": seconds}`` (ValueError when it cannot)."""
    ends: dict[int, float] = {}
    for ev in run.events_named("step_end"):
        if isinstance(ev.get("step"), int) and "time" in ev:
            ends[ev["step"]] = float(ev["time"])  # the last one wins (a step redone after a restart)
    steps = sorted(ends)
    if len(steps) < skip_steps + min_steps:
        raise ValueError(f"{len(steps)} step_end events; need {skip_steps} warm-up + {min_steps} measured steps")
    t0, window = _window_start(run, ends, steps, skip_steps), steps[skip_steps:]
    series = [run.metric_series(k) for k in COUNT_KEYS[unit]]
    count = 0.0
    for step in window:
        missing = [k for k, s in zip(COUNT_KEYS[unit], series, strict=True) if step not in s]
        if missing:
            raise ValueError(f"step {step}: no {', '.join(missing)} in metrics.jsonl")
        count += math.prod(s[step] for s in series)
    seconds = ends[window[-1]] - t0
    if seconds <= 0:
        raise ValueError(f"steps {window[0]}..{window[-1]} took {seconds:.3g} s of wall time")
    return {"value": count / seconds, "steps": float(len(window)), "window_s": seconds}


@register("throughput")
class Throughput(CheckParams):
    kind: Literal["throughput"] = "throughput"
    run: str | None = None
    baseline_key: str | None = None  # None: the scenario's baseline key
    unit: Literal["samples", "tokens"] = "samples"
    skip_steps: int = Field(2, ge=0)  # warm-up steps before the measured window
    min_steps: int = Field(3, ge=1)
    tolerance: float | None = Field(None, gt=0, lt=1)  # smallest drop that may fail; None: the profile's

    @property
    def metric(self) -> str:
        return f"{self.unit}_per_s"

    def min_tolerance(self, ctx: CheckContext) -> float:
        return THROUGHPUT_MIN_TOLERANCE[ctx.profile] if self.tolerance is None else self.tolerance

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        key = self.baseline_key or ctx.baseline_key
        got = measure(ctx.run(self.run), self.unit, self.skip_steps, self.min_steps)
        m = {**got, "metric": self.metric, "baseline_key": key, "spec": ctx.spec_digest,
             "min_tolerance": self.min_tolerance(ctx)}
        details = {"machine_class": ctx.machine_class, "baseline_key": key}
        base = baselines.entry(ctx.baselines_dir, ctx.machine_class, key) if key else None
        missing = baselines.missing_reason(base, ctx.machine_class, key, ctx.spec_digest)
        text = f"{self.metric} {got['value']:.4g} over {int(got['steps'])} steps"
        if missing:
            if ctx.require_baselines:
                return self.result(False, f"{text}; {missing} (--require-baselines)", details=details, measurements=m)
            return self.no_baseline(f"{text}; {missing}", details=details, measurements=m)
        if base.get("metric") != self.metric:
            return self.result(False, f"baseline {key} for {ctx.machine_class} measures {base.get('metric')}, the "
                                      f"check {self.metric}; re-record it", details=details, measurements=m)
        verdict = baselines.judge(got["value"], base, self.min_tolerance(ctx))
        m["baseline"] = {"median": verdict.median, "lower": verdict.lower, "values": base.get("values", [])}
        details["comparison"] = verdict.line(self.metric, got["value"])
        return self.result(verdict.ok, f"{details['comparison']} [{ctx.machine_class}]", details=details,
                           measurements=m)
