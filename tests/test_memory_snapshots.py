"""--record-memory-history / --memory-snapshot-* (relax/observability/memory.py): the allocator history starts with
the backend, a snapshot is written after the N-th step of the launch and when a step runs out of memory (the
error still raised), named by rank and moment under the seed's default directory; a run without a GPU refuses the
flags in one line each. The CUDA calls are recorded here; tests/gpu/test_memory_snapshot_gpu.py runs them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relax.observability.memory import MAX_ENTRIES, MemoryConfig, MemoryRecorder
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError


@pytest.fixture
def cuda_calls(monkeypatch) -> list[tuple]:
    calls: list[tuple] = []
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", lambda **kw: calls.append(("record", kw)))

    def dump(path: str) -> None:
        Path(path).write_bytes(b"snapshot")
        calls.append(("dump", Path(path)))

    monkeypatch.setattr(torch.cuda.memory, "_dump_snapshot", dump)
    return calls


def _config(tmp_path: Path, **flags) -> MemoryConfig:
    values = {"record_memory_history": True, "memory_snapshot_path": "snapshot.pickle", "memory_snapshot_dir": None,
              "memory_snapshot_num_steps": None, "memory_recorder": "torch", "output_dir": str(tmp_path / "run"),
              "tb_experiment_name": "exp"}
    return MemoryConfig(**{**values, **flags})


def test_history_from_the_start_and_a_snapshot_after_the_nth_step(tmp_path: Path, cuda_calls) -> None:
    recorder = MemoryRecorder(_config(tmp_path, memory_snapshot_num_steps=3), rank=1)
    assert cuda_calls == [("record", {"max_entries": MAX_ENTRIES})]
    for step in range(10, 15):  # a resumed launch: steps 10.. ; the count is this launch's
        with recorder.step(step):
            pass
    expected = tmp_path / "run" / "traces" / "exp" / "memory_snapshot" / "rank1_step12_snapshot.pickle"
    assert cuda_calls[1:] == [("dump", expected)] and expected.read_bytes() == b"snapshot"


def test_a_step_out_of_memory_leaves_a_snapshot_and_still_fails(tmp_path: Path, cuda_calls) -> None:
    recorder = MemoryRecorder(_config(tmp_path, memory_snapshot_dir=str(tmp_path / "snaps"),
                                      memory_snapshot_path="m.pickle"))
    with pytest.raises(torch.OutOfMemoryError), recorder.step(4):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    assert cuda_calls[1:] == [("dump", tmp_path / "snaps" / "rank0_oom_step4_m.pickle")]


def test_nothing_is_recorded_without_the_flags(tmp_path: Path, cuda_calls) -> None:
    recorder = MemoryRecorder(_config(tmp_path, record_memory_history=False))
    with pytest.raises(torch.OutOfMemoryError), recorder.step(0):
        raise torch.OutOfMemoryError("out of memory")
    assert cuda_calls == []


def test_a_run_without_a_gpu_refuses_them_in_one_line_each() -> None:
    with pytest.raises(ConfigError) as err:
        parse_args(["--preset", "quickstart", "--device", "cpu", "--record-memory-history",
                    "--memory-snapshot-num-steps", "2", "--memory-recorder", "memray"])
    assert sorted(err.value.problems) == sorted([
        "--record-memory-history needs a CUDA GPU (the CUDA allocator's history); --device cpu uses none",
        "--memory-snapshot-num-steps 2 needs a CUDA GPU (a snapshot of the CUDA allocator); --device cpu uses none",
        "not supported yet: --memory-recorder memray"])
