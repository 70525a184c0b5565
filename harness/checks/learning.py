"""Did it learn? And generic metric bounds (``max(train/x) < y``) over logged metrics."""

from __future__ import annotations

import operator
import statistics
from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

_OPS = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_REDUCE = {"max": max, "min": min, "mean": statistics.fmean, "first": lambda v: v[0], "last": lambda v: v[-1]}


@register("learning")
class Learning(CheckParams):
    """Mean of the last k steps >= ``min_last`` and >= ``min_ratio`` x the mean of the first k.

    With ``decrease: true`` (a loss or a KL that must fall) the last-k mean must instead be
    <= the first-k mean / ``min_ratio``.

    ``max_drop``: it also keeps what it learned: the last-k mean is at most this much below the best mean of any
    k consecutive steps (a run that peaks and decays fails even if it ends above ``min_last``).
    """

    kind: Literal["learning"] = "learning"
    run: str | None = None
    key: str = "rollout/reward_mean"
    k: int = 3
    min_last: float = 0.0
    min_ratio: float = 1.0
    decrease: bool = False
    max_drop: float | None = None

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        series = ctx.run(self.run).metric_series(self.key)
        values = list(series.values())
        if len(values) < self.k:
            return self.result(False, f"{self.key}: only {len(values)} steps logged, need at least k={self.k}")
        first, last = statistics.fmean(values[: self.k]), statistics.fmean(values[-self.k :])
        steps = list(series)
        span = f"steps {steps[-self.k]}..{steps[-1]}"
        m = {"first_mean": first, "last_mean": last}
        if self.decrease:
            if not last * self.min_ratio <= first:
                return self.result(False, f"did not fall: mean {self.key} over {span} is {last:.4g} > first-{self.k} "
                                          f"mean {first:.4g} / {self.min_ratio:g}", measurements=m)
            return self.result(True, f"{self.key}: first-{self.k} mean {first:.4g} -> last-{self.k} mean {last:.4g}",
                               measurements=m)
        if not last >= self.min_last:
            return self.result(False, f"did not learn: mean {self.key} over {span} is {last:.4g} < {self.min_last:g}",
                               measurements=m)
        if not last >= self.min_ratio * first:
            return self.result(False, f"did not learn: mean {self.key} over {span} is {last:.4g} < "
                                      f"{self.min_ratio:g} x first-{self.k} mean {first:.4g}", measurements=m)
        if self.max_drop is not None:
            windows = [statistics.fmean(values[i: i + self.k]) for i in range(len(values) - self.k + 1)]
            best_at = max(range(len(windows)), key=windows.__getitem__)
            m["best_mean"] = windows[best_at]
            if windows[best_at] - last > self.max_drop:
                return self.result(False, f"did not keep it: mean {self.key} over {span} is {last:.4g}, "
                                          f"{windows[best_at] - last:.3g} below its best {self.k}-step mean "
                                          f"{windows[best_at]:.4g} (steps {steps[best_at]}..{steps[best_at + self.k - 1]}; "
                                          f"allowed {self.max_drop:g})", measurements=m)
        return self.result(True, f"{self.key}: first-{self.k} mean {first:.4g} -> last-{self.k} mean {last:.4g}",
                           measurements=m)


@register("metric_bound")
class MetricBound(CheckParams):
    """``reduce(metric over steps) op value``, e.g. ``max(train/grad_norm) < 100``."""

    kind: Literal["metric_bound"] = "metric_bound"
    run: str | None = None
    key: str
    reduce: Literal["max", "min", "mean", "first", "last"] = "max"
    op: Literal["<", "<=", ">", ">="] = "<"
    value: float

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        series = ctx.run(self.run).metric_series(self.key)
        if not series:
            return self.result(False, f"no {self.key} in metrics.jsonl")
        got = _REDUCE[self.reduce](list(series.values()))
        expr = f"{self.reduce}({self.key}) = {got:.4g} {self.op} {self.value:g}"
        if _OPS[self.op](got, self.value):
            return self.result(True, expr, measurements={self.key: got})
        bad = [s for s, v in series.items() if not _OPS[self.op](v, self.value)]
        return self.result(False, f"violated: {expr} is false (first offending step {bad[0] if bad else '?'})",
                           measurements={self.key: got})
