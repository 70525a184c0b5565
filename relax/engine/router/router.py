"""A router in front of several engine servers (embedded or SGLang), behind one address.

    python -m relax.engine.router --port 30000 --worker-urls http://127.0.0.1:30001 http://127.0.0.1:30002

* ``/generate`` goes to the live worker with the fewest outstanding requests; a request with a
  routing key (header ``X-Routing-Key`` or body field ``routing_key``, stripped before
  forwarding) sticks to one worker (rendezvous hashing over the live workers).
* Failover (on by default): if a worker cannot be reached, drops the connection or answers 5xx, the
  request is retried on another live worker (seeded requests give the same tokens there) and the worker is
  marked suspect until a health check passes. Without it (``failover=False``: a training run without
  ``--use-fault-tolerance``) the request fails with 502 naming the worker. An error answer that came from a
  worker carries its URL in the ``X-Relax-Worker`` header, so the run's failure line names that engine.
* A background loop checks ``/health`` of every worker each ``--health-check-interval`` s; a
  worker failing ``--slime-router-health-check-failure-threshold`` consecutive checks is marked
  unhealthy (skipped while a healthy worker exists) and, with ``remove_unhealthy`` (the standalone
  router), removed. A training run's router keeps it (a busy engine, e.g. compiling, answers late;
  the run's fault tolerance decides what is dead).
* ``/add_worker?url=`` and ``/remove_worker?url=`` change the pool at run time (`drain_worker` first stops
  new requests to a worker that is about to leave, so the ones it has can finish); ``/list_workers``
  shows it. Control endpoints (abort, pause, continue, flush, release/resume memory, disk weight
  updates) are broadcast to every worker.
* Text or token ids: ``/generate`` bodies pass through as SGLang takes them (``input_ids``, or ``text`` / a
  list of texts that the engine tokenizes); ``--use-slime-router`` makes the run's default rollout send text.
* Middlewares (``--slime-router-middleware-paths``, relax/engine/router/middleware.py) wrap every request sent to
  one engine, in the order given; without any, bodies are not parsed (the router reads ``routing_key`` only).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from relax.engine.protocol import parse_weight_version
from relax.engine.router import middleware
from relax.engine.router.middleware import RoutedRequest, RoutedResponse
from relax.utils.http_utils import WORKER_HEADER
from relax.utils.json_codec import JSONDecodeError, dumps, json_response, loads

log = logging.getLogger("relax.router")

BROADCAST_PATHS = ("/abort_request", "/pause_generation", "/continue_generation", "/flush_cache",
                   "/release_memory_occupation", "/resume_memory_occupation", "/update_weights_from_disk")
_CONNECTION_ERRORS = (aiohttp.ClientConnectionError, ConnectionError, asyncio.TimeoutError)


@dataclass
class Worker:
    url: str
    outstanding: int = 0
    failures: int = 0  # consecutive failed health checks
    suspect: bool = False  # a request failed to reach it; skipped until a health check passes
    draining: bool = False  # leaving the pool (scale-in): gets no new request, finishes the ones it has
    served: int = 0
    first_request_at: float | None = None  # wall time the router first sent it a request (an engine's join time)
    added: float = field(default_factory=time.monotonic)
    gone: asyncio.Event = field(default_factory=asyncio.Event)  # set when removed from the pool

    def info(self) -> dict[str, Any]:
        return {"url": self.url, "outstanding": self.outstanding, "failures": self.failures,
                "suspect": self.suspect, "served": self.served, "draining": self.draining,
                "first_request_at": self.first_request_at}


def _norm(url: str) -> str:
    url = url.strip().rstrip("/")
    return url if "://" in url else f"http://{url}"


class NoWorker(RuntimeError):
    pass


class Router:
    def __init__(self, worker_urls: list[str] = (), *, failure_threshold: int = 3, health_interval: float = 1.0,
                 health_timeout: float = 2.0, request_timeout: float | None = None, max_connections: int = 1024,
                 api_key: str | None = None, worker_api_key: str | None = None, failover: bool = True,
                 remove_unhealthy: bool = True):
        self.workers: dict[str, Worker] = {}
        for url in worker_urls:
            self.add_worker(url)
        self.failure_threshold = failure_threshold
        self.health_interval = health_interval
        self.health_timeout = health_timeout
        self.request_timeout = request_timeout
        self.max_connections = max_connections
        self.api_key = api_key
        self.worker_headers = {"Authorization": f"Bearer {worker_api_key}"} if worker_api_key else {}
        self.failover = failover
        self.remove_unhealthy = remove_unhealthy
        self.session: aiohttp.ClientSession | None = None
        # --slime-router-middleware-paths, built by the caller (relax/engine/router/middleware.py): [(path, hook)]
        self.middlewares: list[tuple[str, middleware.Middleware]] = []
        self._health_task: asyncio.Task | None = None

    # ------------------------------------------------------------------ pool
    def add_worker(self, url: str) -> Worker:
        url = _norm(url)
        return self.workers.setdefault(url, Worker(url))

    def remove_worker(self, url: str) -> bool:
        w = self.workers.pop(_norm(url), None)
        if w is not None:
            w.gone.set()  # in-flight requests on it move elsewhere
        return w is not None

    def drain_worker(self, url: str) -> bool:
        """Send ``url`` no new request; the ones it has run on (`outstanding` counts them). False: not in the pool."""
        w = self.workers.get(_norm(url))
        if w is not None:
            w.draining = True
        return w is not None

    def outstanding(self, url: str) -> int:
        w = self.workers.get(_norm(url))
        return w.outstanding if w is not None else 0

    def pick(self, key: str | None = None, exclude: frozenset[str] = frozenset()) -> Worker:
        candidates = [w for w in self.workers.values() if w.url not in exclude and not w.draining]
        healthy = [w for w in candidates if not w.suspect]
        pool = healthy or candidates
        if not pool:
            raise NoWorker("no live worker behind the router")
        if key is not None:
            return max(pool, key=lambda w: hashlib.blake2b(f"{key}|{w.url}".encode(), digest_size=8).digest())
        return min(pool, key=lambda w: (w.outstanding, w.served))

    # ------------------------------------------------------------------ lifecycle
    async def start(self, app: web.Application) -> None:
        connector = aiohttp.TCPConnector(limit=self.max_connections)
        self.session = aiohttp.ClientSession(connector=connector, trust_env=False)
        self._health_task = asyncio.create_task(self._health_loop())

    async def stop(self, app: web.Application) -> None:
        if self._health_task:
            self._health_task.cancel()
        if self.session:
            await self.session.close()

    async def _health_loop(self) -> None:
        while True:
            await asyncio.sleep(self.health_interval)
            workers = list(self.workers.values())
            results = await asyncio.gather(*(self._check(w) for w in workers))
            for w, ok in zip(workers, results, strict=True):
                if ok:
                    w.failures, w.suspect = 0, False
                    continue
                w.failures += 1
                if w.failures < self.failure_threshold:
                    continue
                w.suspect = True
                if self.remove_unhealthy and self.workers.get(w.url) is w:
                    log.warning("removing worker %s after %d failed health checks", w.url, w.failures)
                    self.remove_worker(w.url)

    async def _check(self, w: Worker) -> bool:
        try:
            async with self.session.get(f"{w.url}/health", headers=self.worker_headers,
                                        timeout=aiohttp.ClientTimeout(total=self.health_timeout)) as resp:
                return resp.status == 200
        except (*_CONNECTION_ERRORS, aiohttp.ClientError):
            return False

    # ------------------------------------------------------------------ forwarding
    async def _send(self, w: Worker, method: str, path: str, body: bytes | None,
                    timeout: float | None, extra_headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        headers = {**(extra_headers or {}), "Content-Type": "application/json", **self.worker_headers}
        async with self.session.request(method, f"{w.url}{path}", data=body, headers=headers,
                                        timeout=aiohttp.ClientTimeout(total=timeout)) as resp:
            return resp.status, await resp.read()

    async def _send_unless_gone(self, w: Worker, method: str, path: str, body: bytes | None,
                                headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """`_send`, abandoned (as a connection error) if the worker is removed meanwhile (e.g. hung)."""
        send = asyncio.ensure_future(self._send(w, method, path, body, self.request_timeout, headers))
        gone = asyncio.ensure_future(w.gone.wait())
        try:
            await asyncio.wait([send, gone], return_when=asyncio.FIRST_COMPLETED)
        finally:
            gone.cancel()
        if not send.done():
            send.cancel()
            raise ConnectionError(f"worker {w.url} was removed from the pool")
        return send.result()

    async def forward(self, method: str, path: str, body: bytes | None, key: str | None = None) -> web.Response:
        status, data, worker = await self._route(method, path, body, key)
        headers = {WORKER_HEADER: worker} if status >= 400 and worker is not None else None
        return web.Response(status=status, body=data, content_type="application/json", headers=headers)

    async def _route(self, method: str, path: str, body: bytes | None, key: str | None = None,
                     headers: dict[str, str] | None = None) -> tuple[int, bytes, str | None]:
        """Send to one worker; on a connection failure or a 5xx answer retry on the others (each at most once).
        When every worker answered 5xx, the last answer goes back as it came. -> (status, body, worker url)."""
        tried: set[str] = set()
        last_error = "no live worker behind the router"
        last_answer: tuple[int, bytes, str] | None = None
        while True:
            try:
                w = self.pick(key, frozenset(tried))
            except NoWorker:
                if last_answer is not None:
                    return last_answer
                return _error_answer(503, f"{last_error} (tried {len(tried)} worker(s))")
            tried.add(w.url)
            w.outstanding += 1
            if w.first_request_at is None:
                w.first_request_at = time.time()
            try:
                status, data = await self._send_unless_gone(w, method, path, body, headers)
            except _CONNECTION_ERRORS as exc:
                w.suspect = True
                last_error = (f"worker {w.url}: no {path} answer within {self.request_timeout:g} s"
                              if isinstance(exc, asyncio.TimeoutError) else
                              f"worker {w.url} failed: {type(exc).__name__}: {exc}".rstrip(": "))
                if not self.failover:
                    return _error_answer(502, last_error)
                log.warning("%s; retrying elsewhere", last_error)
                continue
            finally:
                w.outstanding -= 1
            if status >= 500 and self.failover:  # SGLang's router retries 5xx too; 4xx stays the caller's fault
                w.suspect = True
                last_answer = (status, data, w.url)
                log.warning("worker %s answered %d; retrying elsewhere", w.url, status)
                continue
            w.served += 1
            return status, data, w.url

    async def through_middlewares(self, request: RoutedRequest) -> web.Response:
        """``request`` through the --slime-router-middleware-paths chain, the innermost call routing it."""
        async def route(req: RoutedRequest) -> RoutedResponse:
            status, data, worker = await self._route(req.method, req.path, req.body(), req.routing_key,
                                                     req.engine_headers)
            return RoutedResponse.from_bytes(status, data, worker)

        answer = await middleware.chain(self.middlewares, route)(request)
        headers = dict(answer.headers)
        if answer.status >= 400 and answer.worker is not None:  # the client's failure line names the engine
            headers.setdefault(WORKER_HEADER, answer.worker)
        if not any(k.lower() == "content-type" for k in headers):  # a middleware may set its own
            headers["Content-Type"] = ("application/json" if answer.json is not None or not answer.data
                                       else "text/plain; charset=utf-8")
        return web.Response(status=answer.status, body=answer.body(), headers=headers)

    async def broadcast(self, method: str, path: str, body: bytes | None) -> web.Response:
        workers = list(self.workers.values())
        if not workers:
            return _error(503, "no live worker behind the router")

        async def one(w: Worker) -> Any:
            try:
                status, data = await self._send(w, method, path, body, self.request_timeout)
            except (*_CONNECTION_ERRORS, aiohttp.ClientError) as exc:
                return {"status": 502, "response": {"error": {"message": f"{type(exc).__name__}: {exc}"}}}
            try:  # SGLang answers some control calls with plain text (flush_cache) or nothing
                return {"status": status, "response": loads(data) if data else None}
            except (JSONDecodeError, UnicodeDecodeError):
                return {"status": status, "response": data.decode(errors="replace").strip()}

        results = dict(zip((w.url for w in workers), await asyncio.gather(*(one(w) for w in workers)), strict=True))
        ok = all(r["status"] < 400 for r in results.values())
        return json_response({"success": ok, "workers": results}, status=200 if ok else 502)

    # ------------------------------------------------------------------ http
    def app(self) -> web.Application:
        app = web.Application(client_max_size=16 << 30, middlewares=[self._auth])
        app.on_startup.append(self.start)
        app.on_cleanup.append(self.stop)
        app.router.add_post("/generate", self.h_generate)
        for path in BROADCAST_PATHS:
            app.router.add_post(path, self.h_broadcast)
        app.router.add_post("/add_worker", self.h_add)
        app.router.add_post("/remove_worker", self.h_remove)
        app.router.add_get("/list_workers", self.h_list)
        app.router.add_get("/health", self.h_health)
        app.router.add_get("/get_weight_version", self.h_weight_version)
        app.router.add_get("/model_info", self.h_model_info)
        app.router.add_route("*", "/{tail:.*}", self.h_any)
        return app

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "missing or wrong API key (Authorization: Bearer <key>)")
        return await handler(request)

    async def h_generate(self, request: web.Request) -> web.Response:
        raw = await request.read()
        key = request.headers.get("X-Routing-Key")
        if self.middlewares:
            return await self._routed(request, raw, key, json_body=True)
        if b'"routing_key"' in raw:  # the only field the router reads; other bodies pass through unparsed
            try:
                body = loads(raw)
            except (JSONDecodeError, UnicodeDecodeError) as exc:
                return _error(400, f"malformed JSON body: {exc}")
            if isinstance(body, dict) and "routing_key" in body:
                key = str(body.pop("routing_key"))
                raw = dumps(body)
        return await self.forward("POST", "/generate", raw, key)

    async def _routed(self, request: web.Request, raw: bytes, key: str | None, *, json_body: bool) -> web.Response:
        """A request for one engine, parsed into a `RoutedRequest` for the middleware chain. ``json_body``: the
        path takes a JSON object (``/generate``): anything else answers 400; other paths may send any body."""
        routed = RoutedRequest(request.method, request.path_qs, dict(request.headers), routing_key=key)
        if raw:
            try:
                routed.json = loads(raw)
            except (JSONDecodeError, UnicodeDecodeError) as exc:
                if json_body:
                    return _error(400, f"malformed JSON body: {exc}")
                routed.data = raw
            if json_body and not isinstance(routed.json, dict):
                return _error(400, f"{request.path}: the body must be a JSON object, got "
                                   f"{type(routed.json).__name__}")
        if json_body and isinstance(routed.json, dict) and "routing_key" in routed.json:  # /generate's own field
            routed.routing_key = str(routed.json.pop("routing_key"))
        return await self.through_middlewares(routed)

    async def h_broadcast(self, request: web.Request) -> web.Response:
        return await self.broadcast("POST", request.path, await request.read())

    async def h_any(self, request: web.Request) -> web.Response:
        raw = await request.read()
        if self.middlewares:
            return await self._routed(request, raw, request.headers.get("X-Routing-Key"), json_body=False)
        return await self.forward(request.method, request.path_qs, raw or None)

    async def h_add(self, request: web.Request) -> web.Response:
        url = request.query.get("url")
        if not url:
            return _error(400, "add_worker needs ?url=")
        self.add_worker(url)
        return json_response({"success": True, "urls": list(self.workers)})

    async def h_remove(self, request: web.Request) -> web.Response:
        url = request.query.get("url")
        if not url:
            return _error(400, "remove_worker needs ?url=")
        return json_response({"success": self.remove_worker(url), "urls": list(self.workers)})

    async def h_list(self, request: web.Request) -> web.Response:
        return json_response({"urls": list(self.workers), "workers": [w.info() for w in self.workers.values()]})

    async def h_health(self, request: web.Request) -> web.Response:
        live = [w.url for w in self.workers.values() if not w.suspect and not w.draining]
        return json_response({"status": "ok" if live else "no live worker", "live_workers": live},
                                 status=200 if live else 503)

    async def _versions(self) -> tuple[web.Response, list[dict], list[int]]:
        """Every worker's /model_info (SGLang >= 0.5.10 reports the version there) and their versions."""
        resp = await self.broadcast("GET", "/model_info", None)
        data = loads(resp.body)
        infos = [r["response"] for r in data.get("workers", {}).values()
                 if r["status"] == 200 and isinstance(r["response"], dict)]
        versions = [v for v in (parse_weight_version(i.get("weight_version")) for i in infos) if v is not None]
        return resp, infos, versions

    async def h_model_info(self, request: web.Request) -> web.Response:
        """The workers' model info, with the oldest version any of them serves."""
        resp, infos, versions = await self._versions()
        if not infos:
            return resp
        return json_response({**infos[0], "weight_version": str(min(versions)) if versions else
                                  infos[0].get("weight_version")})

    async def h_weight_version(self, request: web.Request) -> web.Response:
        resp, infos, versions = await self._versions()
        if not versions:
            return resp
        return json_response({"weight_version": str(min(versions))})


def _error_answer(status: int, message: str) -> tuple[int, bytes, None]:
    return status, dumps({"error": {"message": message, "code": status}}), None


def _error(status: int, message: str) -> web.Response:
    return json_response({"error": {"message": message, "code": status}}, status=status)
