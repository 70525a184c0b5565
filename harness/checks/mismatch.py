"""Train/rollout mismatch: the trainer's log-probs against the engine's, over every response token.

- Step 0 (both sides hold the same weights): ``|train/train_rollout_kl|`` (mean of rollout minus trainer
  log-probs) under the precision's bound: the engine against the trainer, not the trainer against itself.
  ``train/ppo_kl`` at step 0 is also bounded (old log-probs and the first loss forward use the same
  micro-batches, so it is 0 unless that slicing breaks).
- Every step: the mean ``|diff|`` and the worst token (the max for fp32 pairs, the p99 for bf16 ones)
  under their bounds. A decode bug that only touches tokens after the 8th hides in a mean; not in a max.

Bounds follow the run's dtypes (run.json ``dtypes``, `harness.profiles.TOLERANCES`) unless stated.
"""

from __future__ import annotations

from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

MEAN_KEY = "train/train_rollout_logprob_abs_diff"
KL_KEY = "train/train_rollout_kl"
PPO_KL_KEY = "train/ppo_kl"
SELF_KL_MAX = 1e-8


@register("logprob_mismatch")
class LogprobMismatch(CheckParams):
    kind: Literal["logprob_mismatch"] = "logprob_mismatch"
    run: str | None = None
    rollout_kl_max: float | None = None  # None: the precision's
    abs_diff_max: float | None = None  # bound on the per-step mean; None: the precision's
    worst_token_max: float | None = None  # bound on the per-step max (fp32) / p99 (bf16); None: the precision's

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        tol = ctx.tol(self.run)
        worst_key = tol.worst_token_key
        bounds = {KL_KEY: tol.rollout_kl_max if self.rollout_kl_max is None else self.rollout_kl_max,
                  MEAN_KEY: tol.logprob_abs_diff_mean_max if self.abs_diff_max is None else self.abs_diff_max,
                  worst_key: tol.logprob_abs_diff_max if self.worst_token_max is None else self.worst_token_max}
        series = {key: run.metric_series(key) for key in (KL_KEY, PPO_KL_KEY, MEAN_KEY, worst_key)}
        problems = [f"no {key} in metrics.jsonl" for key, s in series.items() if not s]
        if not problems:
            first = min(series[KL_KEY])
            kl, self_kl = series[KL_KEY][first], series[PPO_KL_KEY].get(first, float("nan"))
            if not abs(kl) <= bounds[KL_KEY]:
                problems.append(f"step {first}: |{KL_KEY}| = {abs(kl):.3g} > {bounds[KL_KEY]:g} (the engine's "
                                "log-probs differ from the trainer's on the same weights)")
            if not abs(self_kl) < SELF_KL_MAX:
                problems.append(f"step {first}: {PPO_KL_KEY} = {self_kl!r} not < {SELF_KL_MAX:g} (old log-probs and "
                                "the first loss forward disagree)")
            for key in (worst_key, MEAN_KEY):
                problems += [f"step {step}: {key} = {v:.3g} > {bounds[key]:g}" for step, v in series[key].items()
                             if not v <= bounds[key]]  # also catches nan
        worst = max(series[worst_key].values(), default=float("nan"))
        mean = max(series[MEAN_KEY].values(), default=float("nan"))
        kl0 = series[KL_KEY][min(series[KL_KEY])] if series[KL_KEY] else float("nan")
        details = {"precision": ctx.precision(self.run).value, "bounds": bounds, "step0_rollout_kl": kl0,
                   "worst_token": worst, "worst_mean": mean, "problems": problems[:20]}
        measurements = {"step0_rollout_kl": kl0, "worst_token": worst, "worst_mean": mean}
        if problems:
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            return self.result(False, problems[0] + more, details=details, measurements=measurements)
        name = worst_key.rsplit("_", 1)[-1]
        return self.result(True, f"{details['precision']}: step-0 rollout kl {kl0:.2g}; per-token |diff| {name} "
                                 f"<= {worst:.2g} (bound {bounds[worst_key]:g}), mean <= {mean:.2g} (bound "
                                 f"{bounds[MEAN_KEY]:g}) over {len(series[MEAN_KEY])} steps",
                           details=details, measurements=measurements)
