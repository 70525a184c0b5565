"""Async HTTP helpers used by rollout code and Relax recipes (``relax.utils.http_utils.post``).

One pooled ``aiohttp`` session per event loop. Failures surface as `EngineError` naming the
address: a refused connection, a connection dropped mid-request (engine killed) or a timeout.
An HTTP 4xx/5xx answer raises `EngineHTTPError` (a subclass) carrying the status and the
server's message; 4xx answers are never retried.
"""

from __future__ import annotations

import asyncio
import json
import time
import weakref
from typing import Any

import aiohttp

from relax.utils.json_codec import CONTENT_TYPE, JSONDecodeError, dumps, loads

_SESSIONS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, aiohttp.ClientSession] = weakref.WeakKeyDictionary()
CONNECT_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 1024


class EngineError(RuntimeError):
    """An engine (or router) at ``url`` could not serve a request."""

    def __init__(self, url: str, message: str):
        super().__init__(f"{url}: {message}")
        self.url = url
        self.message = message

    def __reduce__(self):  # crosses Ray (a trainer actor's push failing on an engine): rebuild from the parts
        return type(self), (self.url, self.message)


# the engine behind a router's error answer: the run's router sets it, so a failure line names the engine, not the router
WORKER_HEADER = "X-Relax-Worker"


class EngineHTTPError(EngineError):
    """The server answered with an HTTP error status."""

    def __init__(self, url: str, status: int, message: str):
        super().__init__(url, f"HTTP {status}: {message}")
        self.status = status
        self.server_message = message

    def __reduce__(self):
        return type(self), (self.url, self.status, self.server_message)


def _session() -> aiohttp.ClientSession:
    loop = asyncio.get_running_loop()
    session = _SESSIONS.get(loop)
    if session is None or session.closed:
        connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, force_close=False)
        session = aiohttp.ClientSession(connector=connector, trust_env=False)
        _SESSIONS[loop] = session
    return session


def run_closing(coro: Any) -> Any:
    """``asyncio.run(coro)``, closing the pooled session that loop opened (each ``asyncio.run`` is a loop of
    its own: its session would otherwise be left unclosed)."""

    async def main() -> Any:
        try:
            return await coro
        finally:
            await close_session()

    return asyncio.run(main())


async def close_session() -> None:
    """Close this loop's pooled session (optional; sessions die with their loop)."""
    session = _SESSIONS.pop(asyncio.get_running_loop(), None)
    if session is not None:
        await session.close()


def _error_message(text: str) -> str:
    try:
        data = json.loads(text)
        if isinstance(data, dict) and isinstance(data.get("error"), dict):
            return str(data["error"].get("message", text))
        if isinstance(data, dict) and "message" in data:
            return str(data["message"])
    except (json.JSONDecodeError, TypeError):
        pass
    return text[:500]


async def request(method: str, url: str, payload: Any = None, *, timeout: float | None = None,
                  headers: dict[str, str] | None = None, connect_timeout: float = CONNECT_TIMEOUT_S,
                  text: bool = False, proxy: str | None = None) -> Any:
    """One HTTP call returning the decoded JSON (or ``None`` for an empty body); ``text``: the body as text
    (SGLang's plain-text answers, e.g. /start_profile's); ``proxy``: an HTTP proxy URL the call goes through
    (``--http-proxy`` for the run's outbound services)."""
    client_timeout = aiohttp.ClientTimeout(total=timeout, connect=min(connect_timeout, timeout or connect_timeout))
    try:
        body = None if payload is None else dumps(payload)
        if body is not None:
            headers = {"Content-Type": CONTENT_TYPE, **(headers or {})}
        async with _session().request(method, url, data=body, headers=headers, timeout=client_timeout,
                                      proxy=proxy) as resp:
            raw = await resp.read()
            if resp.status >= 400:
                message = _error_message(raw.decode(errors="replace"))
                worker = resp.headers.get(WORKER_HEADER)
                raise EngineHTTPError(url, resp.status, f"{message} (from engine {worker})" if worker else message)
            if text:
                return raw.decode(errors="replace")
            return loads(raw) if raw.strip() else None
    except EngineError:
        raise
    except TimeoutError:
        raise EngineError(url, f"no answer within {timeout if timeout is not None else connect_timeout:.3g} s") from None
    except aiohttp.ClientConnectorError as exc:
        raise EngineError(url, f"cannot connect ({exc.os_error or exc})") from None
    except (aiohttp.ClientError, ConnectionError) as exc:
        raise EngineError(url, f"connection failed: {type(exc).__name__}: {exc}") from None
    except JSONDecodeError as exc:
        raise EngineError(url, f"answer is not JSON: {exc}") from None


_POSTER: Any = None  # --use-distributed-post: the driver's poster actors (relax/engine/rollout/distributed_post.py)


def install_poster(poster: Any) -> None:
    """Send this process's `post` calls through ``poster`` (``await poster.post(url, payload, **options)``);
    None: make them here again."""
    global _POSTER
    _POSTER = poster


def poster_installed() -> bool:
    return _POSTER is not None


async def post(url: str, payload: Any = None, max_retries: int = 0, *, timeout: float | None = None,
               headers: dict[str, str] | None = None, retry_delay: float = 1.0, total: float | None = None,
               proxy: str | None = None) -> Any:
    """POST ``payload`` as JSON and return the JSON answer (the Relax recipe helper).

    Connection failures and 5xx answers are retried ``max_retries`` times, ``retry_delay`` s
    apart; 4xx answers raise at once. ``total``: the seconds all attempts together may take (each attempt's
    timeout is cut to what is left; no retry starts past it). ``proxy``: an HTTP proxy URL (``--http-proxy``).
    With ``--use-distributed-post`` the same call is made by one of the run's poster actors (`install_poster`).
    """
    options = dict(max_retries=max_retries, timeout=timeout, headers=headers, retry_delay=retry_delay, total=total,
                   proxy=proxy)
    if _POSTER is not None:
        return await _POSTER.post(url, payload, **options)
    return await local_post(url, payload, **options)


async def local_post(url: str, payload: Any = None, max_retries: int = 0, *, timeout: float | None = None,
                     headers: dict[str, str] | None = None, retry_delay: float = 1.0, total: float | None = None,
                     proxy: str | None = None) -> Any:
    """`post`, made from this process."""
    deadline = None if total is None else time.monotonic() + total
    for attempt in range(max_retries + 1):
        left = None if deadline is None else deadline - time.monotonic()
        try:
            return await request("POST", url, payload, timeout=_least(timeout, left), headers=headers, proxy=proxy)
        except EngineHTTPError as exc:
            if exc.status < 500 or attempt == max_retries:
                raise
        except EngineError as exc:
            if deadline is not None and time.monotonic() + retry_delay >= deadline:
                raise EngineError(url, f"no answer within {total:g} s in all, {attempt + 1} attempt(s); the last: "
                                       f"{exc.message}") from None
            if attempt == max_retries:
                raise
        await asyncio.sleep(retry_delay)
    raise AssertionError("unreachable")


def _least(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


async def get(url: str, *, timeout: float | None = None, headers: dict[str, str] | None = None) -> Any:
    return await request("GET", url, timeout=timeout, headers=headers)
