"""The Megatron backend's ``--async-save`` bookkeeping (relax/backends/megatron/async_save.py) on CPU, against a
queue that behaves as megatron-core's ``AsyncCallsQueue`` does: a call leaves the queue before its finalize
functions (rank 0's ``metadata.json``) have run, and a failed write raises from the finalization. The save itself
runs on the GPU (tests/gpu/test_megatron_gpu.py)."""

from __future__ import annotations

from collections import deque

import pytest

from relax.backends.megatron.async_save import AsyncSaves


class FakeQueue:
    """Calls finish when the test says so; finalizing runs each finished call's finalize function after popping
    it, as megatron-core's `maybe_finalize_async_calls` does."""

    def __init__(self) -> None:
        self.calls: deque = deque()
        self.finished: set[int] = set()
        self.idx = -1

    def schedule_async_request(self, request) -> int:
        self.idx += 1
        self.calls.append((self.idx, request))
        return self.idx

    def maybe_finalize_async_calls(self, blocking: bool = False, no_dist: bool = False) -> list[int]:
        done = []
        while self.calls and (blocking or self.calls[0][0] in self.finished):
            idx, request = self.calls.popleft()
            request()  # the finalize functions: may raise, as megatron's CheckpointException does
            done.append(idx)
        return done

    def get_num_unfinalized_calls(self) -> int:
        return len(self.calls)


def test_a_save_is_running_until_every_rank_has_finalized_it() -> None:
    queue = FakeQueue()
    saves = AsyncSaves(lambda: queue)
    assert saves.status() == "done"  # none started
    seen_while_finalizing = []
    saves.schedule(lambda: seen_while_finalizing.append(saves.status()))
    assert saves.status() == "running"
    assert saves.finalize(blocking=False) == "running"  # not written yet: nothing finalized, no wait
    queue.finished.add(0)
    assert saves.finalize(blocking=False) == "done"
    # read from the driver's polling thread while the metadata is being written: still running
    assert seen_while_finalizing == ["running"]


def test_a_blocking_finish_finalizes_every_save() -> None:
    queue = FakeQueue()
    saves = AsyncSaves(lambda: queue)
    saves.schedule(lambda: None)
    saves.schedule(lambda: None)
    assert saves.finalize(blocking=True) == "done" and queue.get_num_unfinalized_calls() == 0


def test_a_failed_write_becomes_the_status_line_not_an_exception() -> None:
    queue = FakeQueue()
    saves = AsyncSaves(lambda: queue)

    def fail() -> None:
        raise OSError(28, "No space left on device")

    saves.schedule(fail)
    status = saves.finalize(blocking=True)  # a training step must not die of it: the driver ends the run
    assert status.startswith("megatron async save failed: OSError") and "No space left" in status
    assert saves.status() == status


def test_no_queue_is_made_before_the_first_save() -> None:
    def refuse():
        raise AssertionError("made a queue without a save")

    saves = AsyncSaves(refuse)
    assert saves.finalize(blocking=True) == "done" and saves.finalize(blocking=False) == "done"
    with pytest.raises(AssertionError):
        saves.schedule(object())
