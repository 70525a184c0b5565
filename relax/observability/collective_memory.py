"""``--enable-cuda-memory-check``: the device's free memory around every collective relax itself issues.

A collective that fails on a GPU (an NCCL ``unhandled cuda error``, an out-of-memory inside a communicator's
lazy set-up, a broadcast of a weight bucket that no longer fits) usually fails for want of memory, and by the
time its error reaches the driver nobody knows how much there was. With the flag on, each trainer rank reads
``torch.cuda.mem_get_info()`` before each collective it issues (the torch backend's gradient, log-prob and
metric reductions, relax/backends/torch/data_parallel.py; the Megatron backend's weight-export gathers and
pipeline broadcasts; the weight-update group's broadcasts, relax/weights/update_group.py), logs it at debug
level (logger ``relax.collectives``), and on failure re-raises the same exception with a note naming the
collective, the rank and the free / total bytes before it and after the failure. megatron-core's own internal
collectives (its DDP gradient reduce-scatter, its optimizer) are not wrapped: they are megatron-core's.

Volume is bounded: per rank, what the collectives saw is summed up (count per collective, the least free
memory and where) and each train step returns rank 0's summary under `SUMMARY_KEY`; the driver writes it as one
``collective_memory`` event per step in events.jsonl (relax/core/runtime.py). One switch per process, like the
timeline's span recorder: the collectives sit in code that has no config of its own to carry it (a frozen
`DataParallel`, a `WeightUpdateGroup` both ends build). CUDA only: a run without a GPU refuses the flag at
launch (relax/utils/machine_flags.py).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from relax.utils.flag_slice import FlagSlice

LOG = logging.getLogger("relax.collectives")
SUMMARY_KEY = "_collective_memory"  # in a train step's metrics: rank 0's summary, popped into events.jsonl


@dataclass(frozen=True)
class CollectiveMemoryConfig(FlagSlice):
    enable_cuda_memory_check: bool


def _mem_get_info() -> tuple[int, int]:
    import torch

    return torch.cuda.mem_get_info()


class CollectiveMemoryCheck:
    """This process's check: off (free) unless `configure` turned it on."""

    def __init__(self) -> None:
        self.enabled = False
        self.rank = 0
        self._lock = threading.Lock()  # the weight push broadcasts from a thread of its own
        self._reset()

    def configure(self, cfg: CollectiveMemoryConfig, rank: int = 0) -> None:
        self.enabled, self.rank = bool(cfg.enable_cuda_memory_check), rank
        self._reset()

    def _reset(self) -> None:
        self._counts: dict[str, int] = {}
        self._least: tuple[int, int, str] | None = None  # (free, total, collective)

    @contextlib.contextmanager
    def check(self, collective: str, rank: int | None = None) -> Iterator[None]:
        """Around one collective (``collective``: what and on which group, e.g. ``all_reduce(gradients)``);
        ``rank``: the caller's rank in that group, when not its trainer rank."""
        if not self.enabled:
            yield
            return
        rank = self.rank if rank is None else rank
        free, total = _mem_get_info()
        LOG.debug("rank %d %s: %d of %d bytes free on the device", rank, collective, free, total)
        with self._lock:
            self._counts[collective] = self._counts.get(collective, 0) + 1
            if self._least is None or free < self._least[0]:
                self._least = (free, total, collective)
        try:
            yield
        except Exception as exc:
            exc.add_note(_failure_note(collective, rank, free, total))
            raise

    def pop_summary(self) -> dict[str, Any] | None:
        """What the collectives since the last call saw (None: none ran, or the check is off)."""
        with self._lock:
            counts, least = self._counts, self._least
            self._reset()
        if not counts or least is None:
            return None
        return {"rank": self.rank, "collectives": counts, "min_free_bytes": least[0], "total_bytes": least[1],
                "min_free_at": least[2]}


def _failure_note(collective: str, rank: int, free: int, total: int) -> str:
    try:
        now = "{} of {} bytes free after it failed".format(*_mem_get_info())
    except Exception as exc:  # noqa: BLE001 - a broken device cannot say; the note still carries the before
        now = f"free memory after it failed unreadable ({type(exc).__name__})"
    return (f"--enable-cuda-memory-check: collective {collective} on rank {rank}: {free} of {total} bytes free "
            f"on the device before it, {now}")


CHECK = CollectiveMemoryCheck()  # this process's (a trainer rank's); off elsewhere


def configure(cfg: CollectiveMemoryConfig, rank: int = 0) -> None:
    """Turn this process's check on or off (a trainer rank at its start; a function, so an actor class that calls it
    pickles by reference, not with the check's lock)."""
    CHECK.configure(cfg, rank)


def checked(collective: str, rank: int | None = None) -> contextlib.AbstractContextManager[None]:
    """``with checked("all_reduce(gradients)"): dist.all_reduce(...)``: this process's check around a collective."""
    return CHECK.check(collective, rank)
