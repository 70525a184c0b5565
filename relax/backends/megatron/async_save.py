"""``--async-save`` for the Megatron backend: megatron-core's own asynchronous sharded save, finalized at step
boundaries.

`relax.backends.megatron.checkpoint.save_checkpoint` asks ``dist_checkpointing.save`` for an async request
(megatron-core's ``mcore`` strategy: its preload copies this rank's shards to host memory before the call
returns, then a forked process writes them) and hands it to this queue. What cannot run in the background is
the finalization: every rank must agree that every rank's write is done (an all-reduce), then rank 0 writes
``mcore/metadata.json``, the file without which the checkpoint does not load. Those are collectives, so they
run where every rank is anyway: at the start of each training step without waiting (`finalize(blocking=False)`
from the backend's ``train_rollout``), and waiting when the driver asks for the save to be finished (the
trainer actor's ``wait_save``, on every rank). The driver publishes the checkpoint only after `status` says
``done`` (relax/core/saver.py), so a run killed during the write leaves the ``.partial`` directory and the
previous checkpoint loadable.

`status` is read from another thread of the trainer actor (the driver polls while a step trains), so the
count of unfinished saves changes only after a finalization has completed: megatron-core's queue drops a call
before its finalize functions (the metadata write) have run.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


def megatron_queue() -> Any:
    """megatron-core's queue of async calls; each save's writer is a process forked for it (``persistent``
    False: no long-lived writer process beside the trainer actor)."""
    from megatron.core.dist_checkpointing.strategies.async_utils import AsyncCallsQueue

    return AsyncCallsQueue(persistent=False)


class AsyncSaves:
    """This rank's megatron-core async saves in flight and the failure of the last one, if it failed."""

    def __init__(self, make_queue: Callable[[], Any] = megatron_queue) -> None:
        self._make_queue = make_queue
        self._queue = None  # made on the first save
        self._pending = 0
        self._failure: str | None = None
        self._lock = threading.Lock()

    def schedule(self, request) -> None:
        """Start writing ``request`` (an ``AsyncRequest`` from ``dist_checkpointing.save``); every rank calls it."""
        if self._queue is None:
            self._queue = self._make_queue()
        self._queue.schedule_async_request(request)
        with self._lock:
            self._pending += 1

    def finalize(self, *, blocking: bool) -> str:
        """Finalize the saves every rank has finished writing (all of them when ``blocking``); every rank calls
        it at the same point. A failed write is kept as `status`'s line, not raised: the driver ends the run."""
        if self._queue is None or not self._pending:
            return self.status()
        try:
            done = len(self._queue.maybe_finalize_async_calls(blocking=blocking))
        except Exception as exc:  # noqa: BLE001 - megatron raises the same CheckpointException on every rank
            with self._lock:
                self._failure = f"megatron async save failed: {type(exc).__name__}: {exc}"
                self._pending = self._queue.get_num_unfinalized_calls()
            return self.status()
        with self._lock:
            self._pending -= done
        return self.status()

    def status(self) -> str:
        """``running`` while a save is not finalized, ``done`` when none is, or the failure's line."""
        with self._lock:
            if self._failure is not None:
                return self._failure
            return "running" if self._pending else "done"
