"""The fleet's HTTP control endpoint (``--fleet-control-addr HOST:PORT``): scale a running job from outside.

* ``POST /scale_out`` ``{"count": N}``: start N engines (`FleetScaler.scale_out`); answers when they joined or the
  policy removed them: ``{"joined": [...], "removed": [...], "failed": {...}, "engines": [...]}``.
* ``POST /scale_in`` ``{"indices": [i, ...]}``: drain, abort and stop those engines (`FleetScaler.scale_in`).
* ``GET /fleet``: the engines in the run.

Like the engine servers (relax/backends/embedded/server.py), it binds loopback unless told otherwise, and a
host off loopback requires ``--fleet-control-api-key``; with a key every request must carry
``Authorization: Bearer <key>``. A refused request is answered 409 (400 for a malformed one) with one line.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from relax.backends.embedded.hosting import Served, serve_in_thread
from relax.core.elastic import FleetScaler, ScaleError, split_addr
from relax.utils.json_codec import json_response


def _error(status: int, message: str) -> web.Response:
    return json_response({"error": {"message": message, "code": status}}, status=status)


STOP_WAIT_S = 5.0  # at shutdown, how long answers still being written may take


@dataclass
class FleetControl:
    scaler: FleetScaler
    served: Served | None = None
    answering: int = 0  # requests not yet answered (touched only in the serving loop's thread)

    @property
    def url(self) -> str:
        return self.served.url

    @classmethod
    def start(cls, scaler: FleetScaler) -> FleetControl:
        host, port = split_addr(scaler.cfg.fleet_control_addr)
        control = cls(scaler)
        control.served = serve_in_thread(control.app(), host, port, name="relax-fleet-control")
        return control

    def stop(self) -> None:
        """Stop serving once the requests in progress are answered (at most STOP_WAIT_S)."""
        if self.served is None:
            return
        deadline = time.monotonic() + STOP_WAIT_S
        while self.answering and time.monotonic() < deadline:
            time.sleep(0.05)
        self.served.loop.call_soon_threadsafe(self.served.loop.stop)
        self.served = None

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._auth])
        app.router.add_post("/scale_out", self.h_scale_out)
        app.router.add_post("/scale_in", self.h_scale_in)
        app.router.add_get("/fleet", self.h_fleet)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        key = self.scaler.cfg.fleet_control_api_key
        if key is not None and request.headers.get("Authorization") != f"Bearer {key}":
            return _error(401, "missing or wrong API key (Authorization: Bearer <key>)")
        self.answering += 1
        try:
            response = await handler(request)
            await response.prepare(request)
            await response.write_eof()
            return response
        finally:
            self.answering -= 1

    async def _run(self, request: web.Request, field: str, check: type, call: Any) -> web.Response:
        try:
            body = await request.json()
        except ValueError:
            return _error(400, f"{request.path}: expected a JSON body with {field!r}")
        value = body.get(field) if isinstance(body, dict) else None
        ok = isinstance(value, check) and not isinstance(value, bool) and (
            check is not list or all(isinstance(v, int) and not isinstance(v, bool) for v in value))
        if not ok:
            return _error(400, f"{request.path}: {field!r} must be {'a list of engine indices' if check is list else 'an int'}")
        try:
            return json_response(await asyncio.to_thread(call, value))
        except ScaleError as exc:
            return _error(409, str(exc))
        except Exception as exc:  # noqa: BLE001 - answered in one line; the run goes on
            return _error(500, f"{request.path} failed: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")

    async def h_scale_out(self, request: web.Request) -> web.Response:
        return await self._run(request, "count", int, self.scaler.scale_out)

    async def h_scale_in(self, request: web.Request) -> web.Response:
        return await self._run(request, "indices", list, self.scaler.scale_in)

    async def h_fleet(self, request: web.Request) -> web.Response:
        return json_response({"engines": self.scaler.live()})
