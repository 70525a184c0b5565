"""GPU memory snapshots of a trainer rank (``--record-memory-history`` and the ``--memory-snapshot-*`` flags).

torch's allocator history (``torch.cuda.memory._record_memory_history``: a stack and tensor size for every
allocation and free) is recorded from the backend's start, and ``_dump_snapshot`` writes it as the pickle that
``torch.cuda._memory_viz`` and https://pytorch.org/memory_viz read: after ``--memory-snapshot-num-steps`` steps
of this launch, and whenever a step runs out of memory (then the error is raised as before). Files:
``<dir>/rank<R>_<when>_<--memory-snapshot-path>``, ``<dir>`` being ``--memory-snapshot-dir`` or
``<output-dir>/traces/<tb-experiment-name or the output dir's name>/memory_snapshot``. CUDA only: a run without a
GPU refuses the flags at launch (relax/utils/machine_flags.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from relax.observability.config import traces_dir
from relax.utils.flag_slice import FlagSlice

MAX_ENTRIES = 100_000
"""Allocation events the history keeps (torch's ring buffer; Megatron uses the same order of magnitude)."""


@dataclass(frozen=True)
class MemoryConfig(FlagSlice):
    record_memory_history: bool
    memory_snapshot_path: str
    memory_snapshot_dir: str | None
    memory_snapshot_num_steps: int | None  # dump after this many steps (3: after step 2)
    memory_recorder: str  # torch (the only one supported)
    output_dir: str
    tb_experiment_name: str | None

    @property
    def enabled(self) -> bool:
        return self.record_memory_history or self.memory_snapshot_num_steps is not None

    @property
    def snapshot_dir(self) -> Path:
        if self.memory_snapshot_dir:
            return Path(self.memory_snapshot_dir)
        return traces_dir(self.output_dir, self.tb_experiment_name, "memory_snapshot")


class MemoryRecorder:
    def __init__(self, cfg: MemoryConfig, rank: int = 0):
        self.cfg, self.rank, self.steps = cfg, rank, 0
        self.dumped: list[Path] = []
        if cfg.enabled:
            import torch

            torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)  # noqa: SLF001 - torch's own API

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """One train step: a snapshot if it runs out of memory, and after the ``--memory-snapshot-num-steps``-th."""
        import torch

        try:
            yield
        except torch.OutOfMemoryError:
            if self.cfg.enabled:
                self.dump(f"oom_step{step}")
            raise
        self.steps += 1
        if self.cfg.memory_snapshot_num_steps is not None and self.steps == self.cfg.memory_snapshot_num_steps:
            self.dump(f"step{step}")

    def dump(self, when: str) -> Path:
        import torch

        path = self.cfg.snapshot_dir / f"rank{self.rank}_{when}_{Path(self.cfg.memory_snapshot_path).name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.cuda.memory._dump_snapshot(str(path))  # noqa: SLF001 - torch's own API
        self.dumped.append(path)
        return path
