"""The rest of the training-loop flags, without Ray: schedules, slices and one-line errors."""

from __future__ import annotations

from argparse import Namespace

from relax.core.runtime import Runtime


def _runtime(interval: int, start: int = 0) -> Runtime:
    return Runtime(Namespace(update_weights_interval=interval), None, None, None, None, start_step=start)


def test_update_weights_interval_schedule() -> None:
    rt = _runtime(3)
    assert [s for s in range(9) if rt.sync_due(s)] == [2, 5, 8]
    assert [rt.held_version(s) for s in range(7)] == [0, 0, 0, 3, 3, 3, 6]
    assert [rt.held_version(s) for s in range(4)] == [0, 0, 0, 3]
    one = _runtime(1)
    assert all(one.sync_due(s) for s in range(4)) and [one.held_version(s) for s in range(4)] == [0, 1, 2, 3]
    resumed = _runtime(2, start=3)  # resumed at step 3: the start push is version 3, the next sync after step 3
    assert [resumed.held_version(s) for s in (3, 4, 5, 6)] == [3, 4, 4, 6]
    assert resumed.held_version(1) == 3  # fully-async asks for step - k, which may be before the start
