"""SIGINT and SIGTERM end a run the way a failure does: one line, ``run.json`` and ``run_end`` written, Ray shut
down, exit 128 + the signal (130, 143).

The first signal raises `Interrupted` in the main thread, wherever the driver is waiting; the run then records
its end and shuts down. Later signals (a second Ctrl-C, a scheduler's repeated SIGTERM) raise nothing more (an
exception inside the shutdown would leave it half done and print tracebacks): they only mark the shutdown as
hurried, and it skips what it may (`hurried`).
"""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator

SIGNALS = (signal.SIGINT, signal.SIGTERM)


class Interrupted(BaseException):  # noqa: N818 - like KeyboardInterrupt, not an error of the run
    """The run was told to stop by ``signum``."""

    def __init__(self, signum: int):
        self.signum = int(signum)
        self.name = signal.Signals(self.signum).name
        super().__init__(self.name)

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    first: int | None = None
    repeats: int = 0


_state = _State()


def received() -> Interrupted | None:
    """The interruption, if a signal came: what a run ends with even when the exception that surfaced is
    another (a signal handler raising inside a C extension's call comes out as a SystemError)."""
    return Interrupted(_state.first) if _state.first is not None else None


def hurried() -> bool:
    """A signal came again after the first: skip what the shutdown may skip."""
    return _state.repeats > 0


def _handler(signum: int, frame) -> None:  # noqa: ARG001 - the signal module's signature
    if _state.first is None:
        _state.first = signum
        raise Interrupted(signum)
    _state.repeats += 1


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """SIGINT and SIGTERM raise `Interrupted` (once) inside; the previous handlers come back after."""
    before = {s: signal.getsignal(s) for s in SIGNALS}
    _state.first, _state.repeats = None, 0
    for s in SIGNALS:
        signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
