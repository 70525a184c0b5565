"""The Ray actors of the fully-async services (relax/core/services.py): forward copies and advantages.

The actor_fwd copy receives every weight sync through SGLang's weight endpoints, served from the
actor's own thread (`relax.backends.embedded.weight_routes`), exactly as an engine does.
"""

from __future__ import annotations

import asyncio
import os
import threading

import ray
import torch

from relax.backends.config import TrainerConfig
from relax.backends.services import AdvantageService, ForwardService
from relax.utils.gc_pauses import collections_paused
from relax.weights import checksum
from relax.weights.devices import device_identity


def _init_process() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@ray.remote
class ForwardServiceActor:
    """The ``reference`` or ``actor_fwd`` service (`relax.backends.services.ForwardService`)."""

    def __init__(self, cfg: TrainerConfig, device: str, role: str, host: str = "127.0.0.1",
                 api_key: str | None = None):
        _init_process()
        with collections_paused():  # the model classes' imports and the build (relax/utils/gc_pauses.py)
            self.service = ForwardService(cfg, device, role)
            checksum.warm_up(self.service.device)
        self._lock = threading.Lock()  # a weight update never runs inside a forward pass
        self.url = self._serve(host, api_key) if role == "actor_fwd" else None

    def _serve(self, host: str, api_key: str | None) -> str:
        from aiohttp import web

        from relax.backends.embedded.hosting import serve_in_thread
        from relax.backends.embedded.server import EngineServer
        from relax.backends.embedded.weight_routes import WeightRoutes
        from relax.utils.json_codec import json_response

        async def run(fn):
            def locked():
                with self._lock:
                    return fn()
            return await asyncio.get_running_loop().run_in_executor(None, locked)

        @web.middleware
        async def auth(request, handler):
            if api_key is not None and request.headers.get("Authorization") != f"Bearer {api_key}":
                return json_response({"error": {"message": "missing or wrong API key"}}, status=401)
            try:
                return await handler(request)
            except (ValueError, KeyError) as exc:
                return json_response({"error": {"message": str(exc)}}, status=400)

        app = web.Application(client_max_size=16 << 30, middlewares=[auth])
        WeightRoutes(self.service, body=EngineServer.body, run=run, checker=self.service.checker()).add_to(app)
        app.router.add_get("/health", lambda request: web.Response(status=200))
        return serve_in_thread(app, host, name="relax-actor-fwd-http").url

    def pid(self) -> int:
        return os.getpid()

    def endpoint(self) -> tuple[str, str]:
        if self.url is None:
            raise RuntimeError(f"the {self.service.role} service receives no weights")
        return self.url, device_identity(self.service.device)

    def log_probs(self, samples, part: tuple[int, int] | None = None):
        with self._lock:
            return self.service.log_probs(samples, part)


@ray.remote
class AdvantagesActor:
    """The ``advantages`` service (`relax.backends.services.AdvantageService`), CPU only."""

    def __init__(self, cfg: TrainerConfig):
        _init_process()
        self.service = AdvantageService(cfg)

    def pid(self) -> int:
        return os.getpid()

    def compute(self, samples, old_log_probs, ref_log_probs):
        return self.service.compute(samples, old_log_probs, ref_log_probs)
