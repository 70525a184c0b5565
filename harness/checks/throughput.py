"""Throughput regression against ``ci/baselines/<key>.json`` (see harness.baselines)."""

from __future__ import annotations

import statistics
from typing import Literal

from pydantic import BaseModel

from harness import baselines
from harness.checks.base import CheckContext, CheckParams, CheckResult, register


class Metric(BaseModel):
    key: str
    higher_is_better: bool = True


DEFAULT_METRICS = [Metric(key="perf/tokens_per_s"), Metric(key="perf/step_time_s", higher_is_better=False)]


@register("throughput")
class Throughput(CheckParams):
    kind: Literal["throughput"] = "throughput"
    run: str | None = None
    baseline_key: str | None = None  # None: the scenario's baseline key
    metrics: list[Metric] = DEFAULT_METRICS
    skip_steps: int = 1  # warm-up steps left out of the median
    tolerance: float | None = None  # None: the profile's

    def measure(self, ctx: CheckContext) -> dict[str, dict]:
        run = ctx.run(self.run)
        out = {}
        for m in self.metrics:
            values = list(run.metric_series(m.key).values())
            values = values[self.skip_steps :] if len(values) > self.skip_steps else values
            if not values:
                raise ValueError(f"no {m.key} in metrics.jsonl")
            raw = statistics.median(values)
            out[m.key] = {"raw": raw, "higher_is_better": m.higher_is_better,
                          "normalized": baselines.normalize(raw, m.higher_is_better, ctx.calibration_s
                                                            if ctx.device_class == "cpu" else None)}
        return out

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        key = self.baseline_key or ctx.baseline_key
        measured = self.measure(ctx)
        details = {"baseline_key": key, "device_class": ctx.device_class, "calibration_s": ctx.calibration_s}
        if not key or ctx.baselines_dir is None:
            return self.skipped("no baseline key or baselines dir; measured only", details=details,
                                measurements=measured)
        base = baselines.entry(baselines.load(ctx.baselines_dir, key), ctx.profile, ctx.device_class)
        if not base:
            return self.skipped(f"no baseline {key!r} for {ctx.profile.value}/{ctx.device_class} in "
                                f"{ctx.baselines_dir}; record one with `relax-harness baseline update`",
                                details=details, measurements=measured)
        tol = ctx.tol.throughput_tolerance if self.tolerance is None else self.tolerance
        lines, ok_all = [], True
        for metric, m in measured.items():
            ref = (base.get("metrics") or {}).get(metric)
            if ref is None:
                lines.append(f"{metric}: no baseline value")
                continue
            ok, line = baselines.compare(metric, m["normalized"], ref, tol)
            ok_all &= ok
            lines.append(line)
        details["comparison"] = lines
        bad = [line for line in lines if "REGRESSION" in line]
        message = "; ".join(bad) if bad else "; ".join(lines)
        return self.result(ok_all, message, details=details, measurements=measured)
