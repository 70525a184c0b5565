"""--record-memory-history with --memory-snapshot-num-steps on CUDA (torch backend): after the second step the
rank's snapshot is on disk and torch's own viewer (torch.cuda._memory_viz, what pytorch.org/memory_viz runs)
renders it with the training's allocations in it. The recorded-calls twin: tests/test_memory_snapshots.py."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from tests.gpu.samples import varied_samples

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_snapshot_after_the_second_step_renders_in_torchs_viewer(tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    from relax.backends.torch.backend import TorchTrainBackend
    from relax.utils.arguments import parse_args

    args = parse_args(["--train-backend", "torch", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "3", "--micro-batch-size", "2", "--output-dir", str(tmp_path / "run"),
                       "--record-memory-history", "--memory-snapshot-num-steps", "2"])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cuda")
    try:
        for step in range(3):
            backend.train_rollout(varied_samples(step), step)
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)  # noqa: SLF001
    snapshots = sorted((tmp_path / "run" / "traces").rglob("*.pickle"))
    assert [p.name for p in snapshots] == ["rank0_step1_snapshot.pickle"]
    data = pickle.loads(snapshots[0].read_bytes())
    assert data["segments"] and any(trace for trace in data["device_traces"])  # the history, not only segments
    assert "<html" in _memory_viz.trace_plot(data).lower()
