"""Train/rollout mismatch: step-0 ppo_kl ~ 0 and the log-prob gap under the profile threshold."""

from __future__ import annotations

from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register


@register("logprob_mismatch")
class LogprobMismatch(CheckParams):
    kind: Literal["logprob_mismatch"] = "logprob_mismatch"
    run: str | None = None
    step0_ppo_kl_max: float | None = None  # None: the profile's (1e-8)
    abs_diff_max: float | None = None  # None: the profile's (cpu 1e-4)
    ppo_kl_key: str = "train/ppo_kl"
    abs_diff_key: str = "train/train_rollout_logprob_abs_diff"

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        kl_max = ctx.tol.step0_ppo_kl_max if self.step0_ppo_kl_max is None else self.step0_ppo_kl_max
        diff_max = ctx.tol.logprob_abs_diff_max if self.abs_diff_max is None else self.abs_diff_max
        kl, diff = run.metric_series(self.ppo_kl_key), run.metric_series(self.abs_diff_key)
        problems = []
        if not kl:
            problems.append(f"no {self.ppo_kl_key} in metrics.jsonl")
        else:
            first = min(kl)
            if not abs(kl[first]) < kl_max:
                problems.append(f"step {first}: {self.ppo_kl_key}={kl[first]!r} not < {kl_max:g} "
                                "(first-step policy must equal the rollout policy)")
        if not diff:
            problems.append(f"no {self.abs_diff_key} in metrics.jsonl")
        for step, value in diff.items():
            if not value <= diff_max:  # also catches nan
                problems.append(f"step {step}: {self.abs_diff_key}={value!r} > {diff_max:g}")
        worst = max(diff.values(), default=float("nan"))
        details = {"step0_ppo_kl": kl.get(min(kl)) if kl else None, "max_abs_diff": worst,
                   "thresholds": {"ppo_kl": kl_max, "abs_diff": diff_max}, "problems": problems[:20]}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details)
        return self.result(True, f"step-0 ppo_kl {details['step0_ppo_kl']:.2g} < {kl_max:g}; "
                                 f"max logprob |diff| {worst:.2g} <= {diff_max:g} over {len(diff)} steps",
                           details=details, measurements={"max_abs_diff": worst})
