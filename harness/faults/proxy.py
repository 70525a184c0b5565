"""An HTTP fault proxy (aiohttp) that sits in front of an engine address.

Each request independently, from a seeded RNG: dropped (connection closed, no response) with
``drop_rate``; answered with ``error_status`` with ``error_rate``; otherwise forwarded, after
``latency_s`` with ``latency_rate``. ``paths`` limits the faults to requests whose path is one of
them (e.g. ``/generate``: generation faults while health checks and weight updates pass untouched);
the others are always forwarded. The proxy runs its own event loop in a daemon thread.
"""

from __future__ import annotations

import asyncio
import random
import threading
from collections import Counter
from typing import Any, Literal

from pydantic import Field

from harness.faults.base import FaultParams, FaultRecorder, register
from harness.placeholders import substitute

_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "content-encoding"}


class FaultProxy:
    def __init__(self, target: str, *, host: str = "127.0.0.1", port: int = 0, error_status: int = 503,
                 error_rate: float = 0.0, latency_s: float = 0.0, latency_rate: float = 1.0,
                 drop_rate: float = 0.0, seed: int = 0, paths: list[str] | None = None):
        self.target = target if target.startswith("http") else f"http://{target}"
        self.host, self.port = host, port
        self.error_status, self.error_rate, self.drop_rate = error_status, error_rate, drop_rate
        self.latency_s, self.latency_rate = latency_s, latency_rate
        self.rng = random.Random(seed)
        self.paths = None if paths is None else frozenset(paths)
        self.stats: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    async def _handle(self, request):
        from aiohttp import web

        self.stats["requests"] += 1
        if self.paths is not None and request.path not in self.paths:
            return await self._forward(request)
        draw = self.rng.random()
        if draw < self.drop_rate:
            self.stats["dropped"] += 1
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError  # nothing is sent back
        if draw < self.drop_rate + self.error_rate:
            self.stats["errors"] += 1
            return web.Response(status=self.error_status, text=f"fault proxy: injected {self.error_status}")
        if self.latency_s and self.rng.random() < self.latency_rate:
            self.stats["delayed"] += 1
            await asyncio.sleep(self.latency_s)
        return await self._forward(request)

    async def _forward(self, request):
        from aiohttp import ClientSession, web

        body = await request.read()
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _HOP}
        async with ClientSession(auto_decompress=False) as session:
            async with session.request(request.method, self.target + request.path_qs, data=body,
                                       headers=headers, allow_redirects=False) as resp:
                payload = await resp.read()
                out_headers = {k: v for k, v in resp.headers.items() if k.lower() not in _HOP}
                self.stats["forwarded"] += 1
                return web.Response(status=resp.status, body=payload, headers=out_headers)

    async def _serve(self) -> None:
        from aiohttp import web

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.host, self.port)
        await site.start()
        self.port = runner.addresses[0][1]
        self._stop = asyncio.Event()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await runner.cleanup()

    def _main(self) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 - surfaced by start()
            self._error = exc
            self._ready.set()
        finally:
            self._loop.close()

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._main, name="fault-proxy", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=10)
        if self._error is not None:
            raise RuntimeError(f"fault proxy could not start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(timeout=10)

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@register("http_proxy")
class HttpProxyFault(FaultParams):
    """Flags reference the proxy as ``{proxy:NAME}`` (host:port) so the engine talks through it. ``target`` may
    name a server the scenario started before it (``{server:NAME}``, an ``engine_server``)."""

    kind: Literal["http_proxy"] = "http_proxy"
    name: str = "engine"
    target: str  # host:port or URL of the real server
    listen_port: int = 0
    error_status: int = 503
    error_rate: float = Field(0.0, ge=0, le=1)
    latency_s: float = Field(0.0, ge=0)
    latency_rate: float = Field(1.0, ge=0, le=1)
    drop_rate: float = Field(0.0, ge=0, le=1)
    seed: int = 0
    paths: list[str] | None = None  # only these request paths get faults (None: every path)

    _proxy: FaultProxy | None = None
    _recorder: FaultRecorder | None = None

    def resolve(self, values: dict[str, str]) -> HttpProxyFault:
        return self.model_copy(update={"target": substitute([self.target], values)[0]})

    def start(self, recorder: FaultRecorder) -> dict[str, str]:
        self._recorder = recorder
        self._proxy = FaultProxy(self.target, port=self.listen_port, error_status=self.error_status,
                                 error_rate=self.error_rate, latency_s=self.latency_s,
                                 latency_rate=self.latency_rate, drop_rate=self.drop_rate, seed=self.seed,
                                 paths=self.paths).start()
        recorder.record(kind=self.kind, name=self.name, listen=self._proxy.address, target=self.target,
                        error_rate=self.error_rate, drop_rate=self.drop_rate, latency_s=self.latency_s)
        return {f"proxy:{self.name}": self._proxy.address}

    def stop(self) -> dict[str, Any]:
        if self._proxy is None:
            return {}
        self._proxy.stop()
        stats = dict(self._proxy.stats)
        if self._recorder is not None:  # in events.jsonl, where fault_outcome's min_injected reads it
            self._recorder.record(event="proxy_stats", name=self.name, stats=stats)
        return {"proxy_stats": stats}
