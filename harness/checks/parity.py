"""Loss parity: two runs (or a run and a stored golden trajectory) agree step by step, within the stated
tolerance of the coarser precision of the two (fp32 pairs: atol 1e-6; a bf16 side: rtol 2e-2, atol 1e-2)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Literal

from harness.artifacts import RunArtifacts, read_jsonl
from harness.checks.base import CheckContext, CheckParams, CheckResult, register

DEFAULT_KEYS = ["train/loss", "train/grad_norm", "rollout/reward_mean"]


def load_golden(path: Path) -> RunArtifacts:
    """A golden trajectory: a run dir, a metrics-style .jsonl, or JSON ``{"steps": [...]}`` / ``[...]``."""
    if path.is_dir():
        return RunArtifacts.load(path)
    if path.suffix == ".jsonl":
        return RunArtifacts(dir=path.parent, metrics=read_jsonl(path))
    data = json.loads(path.read_text())
    steps = data["steps"] if isinstance(data, dict) else data
    return RunArtifacts(dir=path.parent, metrics=list(steps))


def close(a: float, b: float, rtol: float, atol: float) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if math.isinf(a) or math.isinf(b):
        return a == b
    return abs(a - b) <= atol + rtol * abs(b)


@register("loss_parity")
class LossParity(CheckParams):
    kind: Literal["loss_parity"] = "loss_parity"
    runs: list[str] = []  # [a, b]; with ``golden``: [a] (or empty = the first run)
    golden: str | None = None  # path relative to the repository root
    keys: list[str] = DEFAULT_KEYS
    rtol: float | None = None  # None: the stated tolerance of the runs' precision (run.json dtypes)
    atol: float | None = None
    from_step: int = 0
    to_step: int | None = None
    min_steps: int = 1

    def _sides(self, ctx: CheckContext) -> tuple[tuple[str, RunArtifacts], tuple[str, RunArtifacts]]:
        if self.golden:
            a = self.runs[0] if self.runs else next(iter(ctx.runs))
            path = Path(self.golden)
            return (a, ctx.run(a)), (f"golden:{path.name}", load_golden(path if path.is_absolute() else ctx.root / path))
        if len(self.runs) != 2:
            raise ValueError(f"loss_parity needs two runs or a golden trajectory; got runs={self.runs}")
        return (self.runs[0], ctx.run(self.runs[0])), (self.runs[1], ctx.run(self.runs[1]))

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        (na, a), (nb, b) = self._sides(ctx)
        runs = [n for n in (na, nb) if n in ctx.runs]  # a golden file has no dtypes: the run's decide
        rtol = ctx.tol(*runs).parity_rtol if self.rtol is None else self.rtol
        atol = ctx.tol(*runs).parity_atol if self.atol is None else self.atol
        problems: list[str] = []
        max_diff: dict[str, float] = {}
        compared_steps: set[int] = set()
        for key in self.keys:
            sa, sb = a.metric_series(key), b.metric_series(key)
            steps = sorted(s for s in set(sa) | set(sb)
                           if s >= self.from_step and (self.to_step is None or s <= self.to_step))
            for step in steps:
                if step not in sa or step not in sb:
                    missing = na if step not in sa else nb
                    problems.append(f"step {step}: {key} missing in {missing}")
                    continue
                compared_steps.add(step)
                va, vb = sa[step], sb[step]
                diff = abs(va - vb) if math.isfinite(va) and math.isfinite(vb) else math.inf
                if not math.isnan(diff):
                    max_diff[key] = max(max_diff.get(key, 0.0), diff)
                if not close(va, vb, rtol, atol):
                    problems.append(f"step {step}: {key} diverges: {na}={va!r} {nb}={vb!r} "
                                    f"|diff|={diff:.3g} > atol {atol:g} + rtol {rtol:g}")
        details = {"compared_steps": len(compared_steps), "max_abs_diff": max_diff, "rtol": rtol, "atol": atol,
                   "problems": problems[:20]}
        if len(compared_steps) < self.min_steps:
            return self.result(False, f"only {len(compared_steps)} common steps between {na} and {nb} "
                                      f"(need {self.min_steps}); keys {self.keys}", details=details)
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        return self.result(True, f"{na} == {nb} on {', '.join(self.keys)} over {len(compared_steps)} steps "
                                 f"(atol {atol:g}, rtol {rtol:g})", details=details, measurements=max_diff)
