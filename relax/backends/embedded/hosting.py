"""Serve an aiohttp application from a background thread of the current process (a Ray actor's).

Engines and the actor_fwd service live in Ray actors yet speak SGLang's HTTP API like any SGLang
server: the actor's own thread runs the event loop, so Ray calls (pid, endpoint) stay answerable.
Binds loopback unless told otherwise; a non-loopback bind requires an API key.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ipaddress
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class Served:
    """A running app: its base URL and the event loop serving it."""

    url: str
    loop: asyncio.AbstractEventLoop

    def call(self, fn: Callable[[], Any], timeout_s: float = 30.0) -> Any:
        """Run ``fn()`` in the serving loop's thread (where the app's state may be touched) and return its value."""
        future: concurrent.futures.Future = concurrent.futures.Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)

        self.loop.call_soon_threadsafe(run)
        return future.result(timeout_s)


def serve_in_thread(app: web.Application, host: str = "127.0.0.1", port: int = 0, *, name: str = "relax-http",
                    timeout_s: float = 60.0) -> Served:
    """Start ``app`` on ``host:port`` (0: a free port) in a daemon thread; return it once it listens."""
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    shown = f"[{host}]" if ":" in host else host
    url = f"http://{shown}:{sock.getsockname()[1]}"
    ready, failure = threading.Event(), []
    loop = asyncio.new_event_loop()

    async def start() -> None:
        runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await runner.setup()
        await web.SockSite(runner, sock).start()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(start())
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            failure.append(exc)
            ready.set()
            return
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, name=name, daemon=True).start()
    if not ready.wait(timeout_s):
        raise RuntimeError(f"HTTP server did not start on {url} within {timeout_s} s")
    if failure:
        raise RuntimeError(f"HTTP server could not start on {url}: {failure[0]}")
    return Served(url, loop)
