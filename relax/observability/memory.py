"""Memory snapshots of a trainer rank (``--record-memory-history``, ``--memory-snapshot-*``, ``--memory-recorder``).

Two recorders, picked by ``--memory-recorder`` (`RECORDERS`):

- ``torch``: the CUDA allocator's history (``torch.cuda.memory._record_memory_history``: a stack and tensor size
  for every allocation and free), dumped as the pickle that ``torch.cuda._memory_viz`` and
  https://pytorch.org/memory_viz read. CUDA only: a run without a GPU refuses the flags at launch
  (relax/utils/machine_flags.py).
- ``memray``: the process's host memory (every Python and C allocation with its Python stack), as memray capture
  files for ``memray flamegraph`` / ``memray stats``. Runs on CPU or GPU; needs the ``memray`` package (relax's
  ``[memray]`` extra), refused at launch in one line without it. memray writes a capture while it tracks and
  holds one tracker per process, so a dump ends the current capture under its name and starts the next one; the
  capture since the last dump stays in ``rank<R>_live.bin``, which memray reads as it stands when the run ends.

Either starts with the backend; a snapshot is written after ``--memory-snapshot-num-steps`` steps of this launch,
and whenever a step runs out of memory (then the error is raised as before). Files:
``<dir>/rank<R>_<when>_<--memory-snapshot-path>`` (memray's with the suffix ``.bin``), ``<dir>`` being
``--memory-snapshot-dir`` or ``<output-dir>/traces/<tb-experiment-name or the output dir's name>/memory_snapshot``.
"""

from __future__ import annotations

import contextlib
import importlib.util
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from relax.observability.config import traces_dir
from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError

MAX_ENTRIES = 100_000
"""Allocation events the history keeps (torch's ring buffer; Megatron uses the same order of magnitude)."""


@dataclass(frozen=True)
class MemoryConfig(FlagSlice):
    record_memory_history: bool
    memory_snapshot_path: str
    memory_snapshot_dir: str | None
    memory_snapshot_num_steps: int | None  # dump after this many steps (3: after step 2)
    memory_recorder: str  # a key of RECORDERS
    output_dir: str
    tb_experiment_name: str | None

    @property
    def enabled(self) -> bool:
        return self.record_memory_history or self.memory_snapshot_num_steps is not None

    def validate(self) -> None:
        if self.memory_recorder == "memray" and not self.enabled:
            raise ConfigError("--memory-recorder memray records nothing without --record-memory-history or "
                              "--memory-snapshot-num-steps")
        if self.memory_recorder == "memray" and importlib.util.find_spec("memray") is None:
            raise ConfigError("--memory-recorder memray needs the memray package, which is not installed "
                              "(pip install memray, or relax's [memray] extra)")

    @property
    def snapshot_dir(self) -> Path:
        if self.memory_snapshot_dir:
            return Path(self.memory_snapshot_dir)
        return traces_dir(self.output_dir, self.tb_experiment_name, "memory_snapshot")


class _TorchHistory:
    """The CUDA allocator's history, dumped as torch's snapshot pickle."""

    suffix = None  # keeps --memory-snapshot-path's own

    def __init__(self, rank: int, snapshot_dir: Path):
        import torch

        self.out_of_memory = (torch.OutOfMemoryError,)
        torch.cuda.memory._record_memory_history(max_entries=MAX_ENTRIES)  # noqa: SLF001 - torch's own API

    def dump(self, path: Path) -> None:
        import torch

        torch.cuda.memory._dump_snapshot(str(path))  # noqa: SLF001 - torch's own API


class _MemrayCapture:
    """memray's tracker of the whole process: a dump closes the live capture under ``path`` and opens the next."""

    suffix = ".bin"

    def __init__(self, rank: int, snapshot_dir: Path):
        import torch

        self.out_of_memory = (torch.OutOfMemoryError, MemoryError)
        self.live = snapshot_dir / f"rank{rank}_live.bin"
        self.tracker = None
        self._start()

    def _start(self) -> None:
        import memray

        self.live.parent.mkdir(parents=True, exist_ok=True)
        self.live.unlink(missing_ok=True)
        self.tracker = memray.Tracker(self.live)
        self.tracker.__enter__()

    def dump(self, path: Path) -> None:
        self.tracker.__exit__(None, None, None)
        self.live.replace(path)
        self._start()


RECORDERS: dict[str, type[_TorchHistory] | type[_MemrayCapture]] = {"torch": _TorchHistory, "memray": _MemrayCapture}


class MemoryRecorder:
    def __init__(self, cfg: MemoryConfig, rank: int = 0):
        self.cfg, self.rank, self.steps = cfg, rank, 0
        self.dumped: list[Path] = []
        self.recorder = RECORDERS[cfg.memory_recorder](rank, cfg.snapshot_dir) if cfg.enabled else None

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[None]:
        """One train step: a snapshot if it runs out of memory, and after the ``--memory-snapshot-num-steps``-th."""
        try:
            yield
        except BaseException as exc:
            if self.recorder is not None and isinstance(exc, self.recorder.out_of_memory):
                self.dump(f"oom_step{step}")
            raise
        self.steps += 1
        if self.cfg.memory_snapshot_num_steps is not None and self.steps == self.cfg.memory_snapshot_num_steps:
            self.dump(f"step{step}")

    def dump(self, when: str) -> Path:
        name = Path(self.cfg.memory_snapshot_path).name
        if self.recorder.suffix:
            name = str(Path(name).with_suffix(self.recorder.suffix))
        path = self.cfg.snapshot_dir / f"rank{self.rank}_{when}_{name}"
        path.parent.mkdir(parents=True, exist_ok=True)
        self.recorder.dump(path)
        self.dumped.append(path)
        return path
