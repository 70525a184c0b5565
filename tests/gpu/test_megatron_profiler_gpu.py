"""Issue "See what a run does" on the GPU: a Megatron run of ``relax train`` with ``--use-pytorch-profiler`` and
``--record-memory-history`` leaves a Chrome trace of the profiled step and a memory snapshot that torch's own
viewer (``torch.cuda._memory_viz``, what pytorch.org/memory_viz runs) renders. The torch-backend twin of the
snapshot is tests/gpu/test_memory_snapshot_gpu.py; the CPU trace checks are in tests/test_run_report.py."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch

from tests.e2e_helpers import FAST_FLAGS, assert_ok, run_relax

pytestmark = [pytest.mark.gpu, pytest.mark.megatron,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_megatron_run_leaves_a_trace_and_a_snapshot_torch_renders(tmp_path: Path) -> None:
    from torch.cuda import _memory_viz

    run = tmp_path / "run"
    assert_ok(run_relax([*FAST_FLAGS, "--device", "cuda", "--train-backend", "megatron", "--hf-checkpoint",
                         "small-qwen3", "--num-rollout", "3", "--use-pytorch-profiler", "--profile-step-start", "1",
                         "--profile-step-end", "1", "--record-memory-history", "--memory-snapshot-num-steps", "2",
                         "--output-dir", str(run)], tmp_path))
    traces = run / "traces" / "run"
    trace_files = sorted(p.name for p in (traces / "train_trace").iterdir())
    assert trace_files == ["train_overall_step1_rank0.pt.trace.json"]
    events = json.loads((traces / "train_trace" / trace_files[0]).read_text())["traceEvents"]
    assert any(e.get("ph") == "X" and "aten::" in str(e.get("name")) for e in events)
    assert any(e.get("cat") == "kernel" for e in events)  # CUDA kernels, not only the CPU side
    snapshots = sorted(p.name for p in (traces / "memory_snapshot").iterdir())
    assert snapshots == ["rank0_step1_snapshot.pickle"]
    data = pickle.loads((traces / "memory_snapshot" / snapshots[0]).read_bytes())
    assert data["segments"] and any(trace for trace in data["device_traces"])
    assert "<html" in _memory_viz.trace_plot(data).lower()
