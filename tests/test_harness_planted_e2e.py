"""Planted defects in the real engine and trainer (`relax train`, tiny CPU runs) fail the checks made for them.

- A KV-cache decode bug that only shows after token 8 (RELAX_FAULT_DECODE_LOGPROB_SKEW_FROM=8: the engine
  reports log-probs 1e-3 off from the 9th generated token on): invisible to 8-token responses, caught with
  24-token ones, by the step-0 rollout kl, the per-step mean and the worst token.
- A trainer that drops a sample (RELAX_FAULT_TRAINER_DROP_SAMPLE_AT_STEP=1: one row of step 1 never
  reaches the loss): the trainer's own consumed report lacks it, so sample accounting names it.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.executors.local import LocalExecutor
from harness.runner import HarnessConfig, run_scenario
from harness.spec import ScenarioSpec

MECHANICS = ["--preset", "quickstart", "--custom-rm-path", "harness.rewards.digit_share", "--rollout-batch-size", "4",
             "--n-samples-per-prompt", "4", "--global-batch-size", "16", "--micro-batch-size", "8",
             "--num-rollout", "2"]


@pytest.mark.ray
def test_planted_decode_bug_after_token_8_and_dropped_sample(tmp_path: Path) -> None:
    spec = ScenarioSpec.model_validate({
        "name": "planted", "engine_flags": MECHANICS, "timeout_s": 300,
        "env": {"RELAX_FAULT_DECODE_LOGPROB_SKEW_FROM": "8"},
        "runs": [{"name": "short", "flags": ["--rollout-max-response-len", "8"]},
                 {"name": "long", "flags": ["--rollout-max-response-len", "24"],
                  "env": {"RELAX_FAULT_TRAINER_DROP_SAMPLE_AT_STEP": "1"}}],
        "checks": [{"kind": "logprob_mismatch", "name": "mismatch_short", "run": "short"},
                   {"kind": "sample_accounting", "name": "accounting_short", "run": "short"},
                   {"kind": "logprob_mismatch", "name": "mismatch_long", "run": "long"},
                   {"kind": "sample_accounting", "name": "accounting_long", "run": "long"}]})
    res = run_scenario(spec, HarnessConfig(executor=LocalExecutor(), results_dir=tmp_path))
    assert not res.problems, res.summary()
    assert res.check("mismatch_short").passed, res.summary()  # positions 0..7 are not skewed
    assert res.check("accounting_short").passed, res.summary()
    long = res.check("mismatch_long")
    assert not long.passed and long.message.startswith("step 0: |train/train_rollout_kl| = "), long.message
    assert long.measurements["worst_token"] == pytest.approx(1e-3, rel=0.05)  # exactly the planted skew
    problems = " | ".join(long.details["problems"])
    assert "step 0: train/train_rollout_logprob_abs_diff_max = 0.001 > 0.0001" in problems
    dropped = res.check("accounting_long")
    assert not dropped.passed and dropped.message.startswith("step 1: sample group "), dropped.message
    assert "trained by the rollout's record, but the trainer never consumed it" in dropped.message
    assert len(dropped.details["problems"]) == 1  # exactly the one row, nothing at step 0
