"""`gather_or_cancel`: ``asyncio.gather`` for calls that fail together (a user hook per sample, an engine per request).

``asyncio.gather`` raises the first error and leaves the other calls running. When they fail too (the same hook
bug hits every sample), nobody reads their errors: the event loop prints each one as a traceback ("unhandled
exception during asyncio.run() shutdown"), hundreds of them under the run's one-line failure. Here the first
failure cancels the other calls and waits for them (at most ``CANCEL_WAIT_S``) before it is raised, so the run's
error is the only thing printed and no call outlives the step that started it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

T = TypeVar("T")

CANCEL_WAIT_S = 10.0  # a cancelled call that ignores its cancellation is left behind after this


async def gather_or_cancel(*calls: Awaitable[T]) -> list[T]:
    """The calls' results in order, or the first error (in the calls' order among those that failed by then)
    after cancelling the rest. Cancelling the caller cancels every call."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    if not tasks:
        return []
    for task in tasks:  # an error nobody else reads (a call that failed after the first) is read here
        task.add_done_callback(_read_error)
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        await _cancel(tasks)
        raise
    failed = [t for t in tasks if t.done() and not t.cancelled() and t.exception() is not None]
    if failed:
        await _cancel(tasks)
        raise failed[0].exception()
    return [t.result() for t in tasks]


async def _cancel(tasks: list[asyncio.Future]) -> None:
    pending = [t for t in tasks if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        await asyncio.wait(pending, timeout=CANCEL_WAIT_S)


def _read_error(task: asyncio.Future) -> None:
    if not task.cancelled():
        task.exception()
