"""relax/utils/gc_pauses.py: what is alive at setup is frozen (full collections skip it); garbage made later,
cycles included, is still collected."""

from __future__ import annotations

import gc
import weakref

from relax.utils.gc_pauses import freeze_alive, freeze_startup_objects


class _Node:
    def __init__(self) -> None:
        self.me = self  # a reference cycle: only the cyclic collector frees it


def test_startup_objects_are_frozen_and_later_cycles_still_collected() -> None:
    gc.collect()  # what is alive, not the garbage the tests before this one left on the worker (CI: 15% of it)
    alive = len(gc.get_objects())
    try:
        frozen = freeze_startup_objects()
        assert frozen == gc.get_freeze_count() >= alive * 0.9  # what survived the collection before it
        assert len(gc.get_objects()) < alive * 0.1  # collections now walk only what came after
        ref = weakref.ref(_Node())
        assert ref() is not None
        gc.collect()
        assert ref() is None
    finally:
        gc.unfreeze()



def test_freeze_alive_freezes_without_collecting() -> None:
    """`freeze_alive` (the lean runner's, after a graph capture) freezes even garbage that is alive to the collector:
    no collection runs, which is the point inside a run; refcounting still frees what is dropped."""
    gc.collect()
    try:
        cycle = weakref.ref(_Node())  # unreachable cycle, not yet collected
        kept = _Tracked()
        dropped = weakref.ref(kept)
        frozen = freeze_alive()
        assert frozen == gc.get_freeze_count() > 0
        assert cycle() is not None  # frozen with the rest, not collected
        del kept
        assert dropped() is None  # a frozen object without a cycle is still freed when its last reference goes
        gc.collect()
        assert cycle() is not None  # collections skip the frozen
    finally:
        gc.unfreeze()
        gc.collect()


class _Tracked:
    pass
