"""A blocking call awaited from an event loop without holding anything hostage if it never returns.

``asyncio.to_thread`` runs on the loop's executor, whose threads the interpreter joins at exit: a call stuck
for good (a user hook that never returns, rank 0 of an eager gloo group waiting for a member that refused to
join) would then keep the process alive. Here the call runs in a daemon thread of its own.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any


def in_daemon_thread(fn: Callable[..., Any], *args: Any, orphaned: Callable[[Any], None] | None = None,
                     **kwargs: Any) -> asyncio.Future:
    """``fn(*args, **kwargs)`` in a daemon thread, as a future of the running loop. ``orphaned(result)`` is called
    with a result nobody will read (the future was cancelled, or the loop is gone), e.g. to close what it built."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():  # cancelled meanwhile
            if error is None and orphaned is not None:
                orphaned(result)
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def run() -> None:
        try:
            result, error = fn(*args, **kwargs), None
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting side
            result, error = None, exc
        try:
            loop.call_soon_threadsafe(settle, result, error)
        except RuntimeError:  # the loop is gone: nobody awaits this any more
            if error is None and orphaned is not None:
                orphaned(result)

    threading.Thread(target=run, name=f"relax-{getattr(fn, '__name__', 'call')}", daemon=True).start()
    return future
