"""A readers-writer lock across the scenario processes of one session (pytest-xdist workers share it).

A scenario that measures throughput takes it exclusively, every other scenario shared: a timed run never
shares the machine with another scenario of the same session (on 2 cores a neighbour halves it). Two
``flock`` files make it fair: a writer first takes the turnstile, so new readers queue behind it instead
of starving it.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def machine_lock(directory: Path | None, exclusive: bool) -> Iterator[None]:
    """Hold the session's machine lock (no-op when ``directory`` is None)."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / ".turnstile.lock", "a+") as turnstile, open(directory / ".machine.lock", "a+") as main:
        fcntl.flock(turnstile, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        try:
            fcntl.flock(main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        finally:
            if not exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(main, fcntl.LOCK_UN)
            if exclusive:
                fcntl.flock(turnstile, fcntl.LOCK_UN)
