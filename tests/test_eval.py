"""Evaluation rollouts: when they run, what they log, pass@k against a brute-force reference."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from relax.engine.rollout.evaluation import pass_at_k
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

ADDMOD = str(Path(__file__).parents[1] / "relax" / "models" / "tasks" / "addmod.jsonl")


@pytest.mark.parametrize("n, c, k", [(4, 0, 1), (4, 1, 1), (4, 1, 2), (4, 3, 2), (8, 2, 4), (8, 8, 4), (5, 2, 5)])
def test_pass_at_k_matches_enumeration(n: int, c: int, k: int) -> None:
    outcomes = [1] * c + [0] * (n - c)
    subsets = list(itertools.combinations(range(n), k))
    expected = sum(any(outcomes[i] for i in s) for s in subsets) / len(subsets)
    assert abs(pass_at_k(n, c, k) - expected) < 1e-12


@pytest.mark.ray
def test_eval_metrics_in_metrics_jsonl(tmp_path: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "5", "--eval-interval", "2", "--eval-prompt-data", "addmod", ADDMOD,
                      "--n-samples-per-eval-prompt", "4", "--log-passrate", "--output-dir", str(tmp_path / "run")],
                     tmp_path)
    assert_ok(proc)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    with_eval = [m["step"] for m in metrics if "eval/addmod/reward_mean" in m]
    assert with_eval == [0, 2, 4]
    for m in metrics:
        if m["step"] in with_eval:
            assert abs(m["eval/addmod/pass@1"] - m["eval/addmod/reward_mean"]) < 1e-9  # binary rewards
            assert m["eval/addmod/pass@1"] <= m["eval/addmod/pass@2"] <= m["eval/addmod/pass@4"]


@pytest.mark.ray
def test_skip_eval_before_train_and_bad_pairs(tmp_path: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--eval-interval", "2", "--eval-prompt-data", "a", ADDMOD,
                      "--skip-eval-before-train", "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    assert [m["step"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "eval/a/reward_mean" in m] == [2]
    bad = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--eval-interval", "2", "--eval-prompt-data", "a", ADDMOD, "b",
                     "--output-dir", str(tmp_path / "bad")], tmp_path)
    assert bad.returncode == 2 and "takes pairs" in bad.stderr and "Traceback" not in bad.stderr
