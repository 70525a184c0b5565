"""--save-debug-train-data PATH{rollout_id} and --dump-details DIR: each step's training data on disk, in the
format relax/observability/train_dumps.py documents, matching what the step logged."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]


def test_each_step_leaves_its_train_data_and_details(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--save-debug-train-data",
                      str(tmp_path / "debug" / "train_{rollout_id}.pt"), "--dump-details", str(tmp_path / "details"),
                      "--output-dir", str(run)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "debug").iterdir()) == ["train_0.pt", "train_1.pt"]
    assert sorted(p.name for p in (tmp_path / "details").iterdir()) == ["rollout_0.jsonl", "rollout_1.jsonl"]
    metrics = read_jsonl(run / "metrics.jsonl")
    for step in (0, 1):
        data = torch.load(tmp_path / "debug" / f"train_{step}.pt", weights_only=True)
        n = len(data["tokens"])
        assert data["rollout_id"] == step and n == 32
        assert data["loss_masks"].shape == data["advantages"].shape and data["loss_masks"].shape[0] == n
        assert data["response_lengths"].tolist() == [int(m.sum()) for m in data["loss_masks"]]
        rows = read_jsonl(tmp_path / "details" / f"rollout_{step}.jsonl")
        assert len(rows) == n and all(r["rollout_id"] == step for r in rows)
        for i, r in enumerate(rows):
            assert r["tokens"] == data["tokens"][i].tolist()
            assert len(r["advantages"]) == len(r["loss_mask"]) == r["response_length"]
            assert r["advantages"] == pytest.approx(data["advantages"][i, :r["response_length"]].tolist())
            assert r["reward"] == pytest.approx(float(data["rewards"][i]))
        # the per-sample rewards of the step (quickstart's GRPO: normalized per group, so they average to 0)
        assert sum(r["reward"] for r in rows) / n == pytest.approx(0.0, abs=1e-4)
        assert metrics[step]["rollout/num_samples"] == n
