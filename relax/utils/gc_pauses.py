"""Keep Python's full garbage collections short in long-running training processes.

Why: a process that has imported torch, transformers, Ray (and megatron-core) holds hundreds of thousands
to millions of long-lived objects, and every full (generation-2) collection walks all of them: 0.16 s per
collection for 374k objects on the 2-core CI machine (measured with ``gc.collect(2)`` in a process that
imported relax's model stack). A step creates tens of thousands of short-lived objects (responses,
samples, per-token lists), so full collections come every few steps, at a random point of one: the
H100 GRPO runs of commits 9e9cd27 and 7709e5b each had one step of ~1.1-1.2 s among steps of
0.52-0.63 s, and a relax-only run of 4f57e6c (frozen once at setup) two steps whose engine time was
0.56-0.58 s instead of ~0.32 s, seven steps apart, all rows full length (no batch-shape change): the
pattern of a full collection over the objects the first steps' compiles and graph captures left. That
they are collections is inferred, not traced. `freeze_startup_objects` moves everything alive into
the permanent generation (``gc.freeze``), which collections skip: they then walk only what the run
allocated since. Each process calls it once set up (models built, modules imported), and the driver
has every process call it again after each of a run's first steps (`relax.core.runtime.FREEZE_AFTER_STEPS`),
once those compiles are done (two H100 runs of 8a27b2f: no slow step in 10 steps after the warm-up ones,
none above 0.621 s). Nothing that was alive then is collected later, which costs nothing for what a
process builds once and keeps.

Set-up itself runs without collections (`collections_paused`): importing torch and transformers' model classes
allocates hundreds of thousands of objects that all stay alive, and the young-generation collections that their
allocation triggers find nearly nothing to free. Importing torch and the Qwen3 model classes took 2.9-3.1 s of CPU
with collections off against 3.5-3.8 s with them on (three runs each, the 2-core CI machine), and every ``relax
train`` process (the driver, each trainer rank, engine and service actor) pays that import at start. What set-up
leaves for a collection is found by the one `freeze_startup_objects` runs when set-up ends.
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


def freeze_startup_objects() -> int:
    """Collect once, then freeze what survives; returns how many objects are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


@contextlib.contextmanager
def collections_paused() -> Iterator[None]:
    """No automatic collections inside (a process's set-up: its imports and model build); afterwards they are
    as they were before (on, unless the caller had turned them off)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()
