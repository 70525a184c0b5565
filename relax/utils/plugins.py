"""One loader for every user plug-in given by dotted path (reward, generate, filters, losses, ...).

Relax recipes name functions as ``package.module.attr``. Loading goes through
:func:`load_function` so every hook gets the same error: one line naming the flag,
the path and the expected signature, never a bare ImportError traceback.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import inspect
from collections.abc import Callable, Iterator
from typing import Any

from relax.utils.daemon_calls import in_daemon_thread


class PluginError(ValueError):
    """A dotted path could not be imported, or what it names has the wrong shape."""


@functools.cache
def load_object(path: str) -> Any:
    """Import ``package.module.attr`` (or ``package.module:attr``) and return the attribute."""
    module_name, sep, attr = path.replace(":", ".").rpartition(".")
    if not sep or not module_name:
        raise PluginError(f"not a dotted path: {path!r} (expected package.module.name)")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # noqa: BLE001 - any import failure is reported the same way
        raise PluginError(f"cannot import module {module_name!r} for {path!r}: {exc}") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        raise PluginError(f"module {module_name!r} has no attribute {attr!r} (from {path!r})") from None


def load_function(path: str, *, flag: str, signature: str, min_args: int = 0) -> Callable[..., Any]:
    """Load a callable for ``flag`` and check it accepts at least ``min_args`` positional arguments.

    ``signature`` is the documented contract (e.g. ``"reward_func(args, sample, **kwargs) -> float"``)
    and is quoted in every error so users see what to write.
    """
    try:
        fn = load_object(path)
    except PluginError as exc:
        raise PluginError(f"{flag}: {exc}; expected {signature}") from None
    if not callable(fn):
        raise PluginError(f"{flag}: {path!r} is not callable; expected {signature}")
    if min_args:
        try:
            params = inspect.signature(fn).parameters.values()
        except (TypeError, ValueError):
            return fn
        positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if len(positional) < min_args and not any(p.kind == p.VAR_POSITIONAL for p in params):
            raise PluginError(
                f"{flag}: {path!r} takes {len(positional)} positional argument(s), "
                f"expected {signature}"
            )
    return fn


@contextlib.contextmanager
def culprit(flag: str, path: str, detail: str = "") -> Iterator[None]:
    """Name the hook an exception escapes from (a note the one-line failure report shows, relax/utils/errors.py)."""
    try:
        yield
    except Exception as exc:
        exc.add_note(f"in {flag} {path}" + (f" ({detail})" if detail else ""))
        raise


def wrong_answer(hook: str, out: Any, expected: str, got: str | None = None) -> PluginError:
    """A hook's answer of the wrong shape, in one line: ``hook`` (``flag path``) returned ``got`` (by default the
    answer's type, or its items' types for a tuple or list); ``expected`` says what it should have been."""
    if got is None:
        got = f"({', '.join(type(o).__name__ for o in out)})" if isinstance(out, tuple | list) else type(out).__name__
    return PluginError(f"{hook} returned {got}; expected {expected}")


class HookTimeout(TimeoutError):
    """A user hook ran past ``--hook-timeout``."""


async def bounded(flag: str, path: str, timeout_s: float, fn: Callable[..., Any], *args: Any, detail: str = "",
                  serial: asyncio.Lock | None = None, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)`` awaited, or run off the event loop when it is a plain function, and given at most
    ``timeout_s`` seconds: a hook that never returns fails the run in one line naming it (``flag path``) instead
    of hanging it. A plain function runs in a daemon thread of its own, so one left running holds neither the
    event loop nor the process's exit; a coroutine is cancelled. ``serial``: plain functions sharing it run one
    at a time, as they did on the event loop (user code need not be thread-safe)."""
    where = f"{flag} {path}" + (f" ({detail})" if detail else "")
    if not inspect.iscoroutinefunction(fn) and serial is not None:
        async with serial:
            return await bounded(flag, path, timeout_s, fn, *args, detail=detail, **kwargs)
    if inspect.iscoroutinefunction(fn):
        call = fn(*args, **kwargs)
    else:
        call = in_daemon_thread(fn, *args, **kwargs)
    try:
        result = await asyncio.wait_for(call, timeout_s)
        while inspect.isawaitable(result):  # a plain function that returned an awaitable: the rest of the budget
            result = await asyncio.wait_for(result, timeout_s)
        return result
    except TimeoutError:
        raise HookTimeout(f"{where} did not return within --hook-timeout {timeout_s:g} s") from None
