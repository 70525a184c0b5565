"""The multi-turn example (custom generate function over the engine's HTTP API) trains, and its
environment tokens are excluded from the loss."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray]


def test_multi_turn_example_trains_with_env_tokens_masked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--prompt-data", str(REPO / "examples/multi_turn/data.jsonl"),
                      "--custom-generate-function-path", "examples.multi_turn.rollout.generate",
                      "--custom-rm-path", "examples.multi_turn.rollout.reward", "--output-dir", str(tmp_path / "run")],
                     tmp_path)
    assert_ok(proc)
    assert "Unclosed" not in proc.stderr
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1, 2]
    # 1 model token + "+c=" (3 environment tokens) + 1 model token
    assert all(m["rollout/response_len_mean"] == 5 for m in metrics)
    # environment tokens carry log-prob 0 from the recipe: only loss-masked tokens are compared
    assert all(m["train/train_rollout_logprob_abs_diff"] < 1e-4 for m in metrics)
    assert abs(metrics[0]["train/ppo_kl"]) < 1e-8
    versions = {r["version"] for r in read_jsonl(tmp_path / "run" / "weights.jsonl")}
    assert versions == {0, 1, 2, 3}


def test_custom_generate_with_two_engines_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")  # loaded at setup
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--resource", '{"rollout": [2, 0]}',
                      "--custom-generate-function-path", "examples.multi_turn.rollout.generate",
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    assert proc.returncode == 2 and "not supported yet: --custom-generate-function-path with more than one engine" in proc.stderr
