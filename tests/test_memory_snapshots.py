"""--record-memory-history / --memory-snapshot-* / --memory-recorder (relax/observability/memory.py): the recorder
starts with the backend, a snapshot is written after the N-th step of the launch and when a step runs out of memory
(the error still raised), named by rank and moment under the seed's default directory. torch's CUDA history: a run
without a GPU refuses the flags in one line each; its CUDA calls are recorded here and
tests/gpu/test_memory_snapshot_gpu.py runs them. memray (host memory, any machine): real captures, read back with
memray's own reader, here and through `relax train` (skipped where memray is not installed, as in CI); without
memray, or with nothing to record, the flag is refused in one line."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
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
                    "--memory-snapshot-num-steps", "2"])
    assert sorted(err.value.problems) == sorted([
        "--record-memory-history needs a CUDA GPU (the CUDA allocator's history); --device cpu uses none",
        "--memory-snapshot-num-steps 2 needs a CUDA GPU (a snapshot of the CUDA allocator); --device cpu uses none"])


def test_memray_with_nothing_to_record_is_refused() -> None:
    with pytest.raises(ConfigError, match="^--memory-recorder memray records nothing without --record-memory-history "
                                          "or --memory-snapshot-num-steps$"):
        parse_args(["--preset", "quickstart", "--device", "cpu", "--memory-recorder", "memray"])


def test_memray_missing_is_refused_in_one_line(monkeypatch) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "memray" else real(name, *a))
    with pytest.raises(ConfigError, match=r"^--memory-recorder memray needs the memray package, which is not "
                                          r"installed \(pip install memray, or relax's \[memray\] extra\)$"):
        parse_args(["--preset", "quickstart", "--device", "cpu", "--memory-recorder", "memray",
                    "--record-memory-history"])


def test_memray_captures_the_host_allocations_of_each_span(tmp_path: Path) -> None:
    """A 48 MB array allocated in step 11 is in the capture dumped after it (with its Python stack); the next
    capture starts empty, and a step that runs out of host memory leaves its capture and still fails."""
    memray = pytest.importorskip("memray", reason="memray is not installed (relax's [memray] extra)")
    recorder = MemoryRecorder(_config(tmp_path, record_memory_history=False, memory_snapshot_num_steps=2,
                                      memory_recorder="memray"), rank=2)
    held = []
    for step in (10, 11):
        with recorder.step(step):
            if step == 11:
                held.append(np.ones(6_000_000))  # 48 MB
    snaps = tmp_path / "run" / "traces" / "exp" / "memory_snapshot"
    assert recorder.dumped == [snaps / "rank2_step11_snapshot.bin"]
    first = memray.FileReader(recorder.dumped[0])
    big = [r for r in first.get_high_watermark_allocation_records() if r.size == 48_000_000]
    assert len(big) == 1 and any(frame[0] == "test_memray_captures_the_host_allocations_of_each_span"
                                 for frame in big[0].stack_trace(max_stacks=64))
    with pytest.raises(MemoryError), recorder.step(12):
        raise MemoryError("host out of memory")
    assert recorder.dumped[1] == snaps / "rank2_oom_step12_snapshot.bin"
    second = memray.FileReader(recorder.dumped[1])
    assert second.metadata.peak_memory < 48_000_000  # the array was allocated before this capture began


@pytest.mark.timeout(300)
def test_relax_train_on_cpu_writes_memray_captures(tmp_path: Path) -> None:
    memray = pytest.importorskip("memray", reason="memray is not installed (relax's [memray] extra)")
    from tests.e2e_helpers import FAST_FLAGS, run_relax

    out = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--memory-recorder", "memray",
                      "--memory-snapshot-num-steps", "2", "--output-dir", str(out)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    capture = out / "traces" / "run" / "memory_snapshot" / "rank0_step1_snapshot.bin"
    reader = memray.FileReader(capture)
    assert reader.metadata.total_allocations > 0 and reader.metadata.peak_memory > 0
    live = memray.FileReader(capture.with_name("rank0_live.bin"))  # step 2 on, readable as the run left it
    assert live.metadata.total_allocations > 0
