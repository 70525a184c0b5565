"""relax/utils/gc_pauses.py: what is alive at setup is frozen (full collections skip it); garbage made later,
cycles included, is still collected."""

from __future__ import annotations

import gc
import weakref

from relax.utils.gc_pauses import freeze_startup_objects


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_startup_objects_are_frozen_and_later_cycles_still_collected() -> None:
    gc.collect()  # what is alive, not the garbage the tests before this one left on the worker (CI: 15% of it)
    alive = len(gc.get_objects())
    try:
        frozen = freeze_startup_objects()
        assert frozen >= alive * 0.9  # what survived the collection before it
        # a frozen object that another thread frees (a worker's leftover pool threads) leaves the permanent generation
        assert 0 <= frozen - gc.get_freeze_count() < alive * 0.01
        assert len(gc.get_objects()) < alive * 0.1  # collections now walk only what came after
        ref = weakref.ref(_Node())
        assert ref() is not None
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()

