"""The weight half of SGLang's HTTP API, for any holder of policy weights (an engine, the actor_fwd service).

Endpoints: ``/update_weights_from_tensor``, ``/init_weights_update_group``,
``/update_weights_from_distributed``, ``/destroy_weights_update_group``, ``/update_weights_from_disk``,
``/weights_checker`` and ``/get_weight_version``. Bodies are checked against SGLang's request fields
(`relax.engine.protocol`): an unknown field, or a field this server does not implement set to anything
but SGLang's default, answers 400. Answers have SGLang's shape (``{"success", "message"}``; 400 when
``success`` is false). ``/weights_checker`` takes GET or POST with SGLang 0.5.14's actions (snapshot,
reset_tensors, compare, checksum, the default); its ``checksum`` answers per-tensor checksums keyed by HF
name, so both sides of a sync can be compared from weights.jsonl alone (`weights_checker`).

A holder offers ``model``, ``device``, ``weight_version`` and ``update_weights_from_tensors(named,
version)``; ``run`` executes a function with generation held off (the scheduler's ``exclusive()``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import torch
from aiohttp import web

from relax.backends.embedded.weights_checker import WeightsChecker, model_tensors
from relax.engine.protocol import ENDPOINTS_BY_PATH, check_fields, parse_weight_version
from relax.utils.json_codec import json_response
from relax.weights.transports.distributed import DistributedReceiver
from relax.weights.transports.tensor import TensorReceiver

NamedTensors = list[tuple[str, torch.Tensor]]

IMPLEMENTED: dict[str, frozenset[str]] = {
    "/update_weights_from_tensor": frozenset({"serialized_named_tensors", "load_format", "flush_cache",
                                              "abort_all_requests", "weight_version", "torch_empty_cache"}),
    "/init_weights_update_group": frozenset({"master_address", "master_port", "rank_offset", "world_size",
                                             "group_name", "backend"}),
    "/update_weights_from_distributed": frozenset({"names", "dtypes", "shapes", "group_name", "flush_cache",
                                                   "abort_all_requests", "weight_version", "load_format",
                                                   "torch_empty_cache"}),
    "/destroy_weights_update_group": frozenset({"group_name"}),
    "/update_weights_from_disk": frozenset({"model_path", "abort_all_requests", "weight_version", "flush_cache",
                                            "torch_empty_cache"}),
    "/weights_checker": frozenset({"action"}),
}


class WeightHolder(Protocol):
    model: torch.nn.Module
    device: torch.device

    @property
    def weight_version(self) -> int: ...

    def update_weights_from_tensors(self, named: NamedTensors, version: int | str | None = None) -> int: ...


def checked(path: str, body: dict[str, Any]) -> dict[str, Any]:
    """``body`` after SGLang's field check for ``path`` (ValueError -> 400)."""
    check_fields(body, ENDPOINTS_BY_PATH[path].fields, IMPLEMENTED.get(path, frozenset()), path.lstrip("/"))
    return body


def _version(body: dict[str, Any]) -> int | None:
    raw = body.get("weight_version")
    if raw is None:
        return None
    if not isinstance(raw, str):
        raise ValueError(f"weight_version must be a string (SGLang's type), got {raw!r}")
    version = parse_weight_version(raw)
    if version is None:
        raise ValueError(f"weight_version {raw!r}: this engine versions weights with integers")
    return version


def _answer(success: bool, message: str, **extra: Any) -> web.Response:
    return json_response({"success": success, "message": message, **extra}, status=200 if success else 400)


class WeightRoutes:
    """The handlers; ``body`` parses a request's JSON, ``run`` runs a function with generation held off,
    ``abort_all`` aborts every running request (for ``abort_all_requests``); ``checker``: the holder's own
    ``/weights_checker`` (default: over ``holder.model``'s HF-named views)."""

    def __init__(self, holder: WeightHolder, *, body: Callable[[web.Request], Awaitable[dict[str, Any]]],
                 run: Callable[[Callable[[], Any]], Awaitable[Any]], abort_all: Callable[[], Any] = lambda: None,
                 checksum_layout: str = "relax", checker: WeightsChecker | None = None):
        self.holder, self.body, self.run, self.abort_all = holder, body, run, abort_all
        self.checker = checker or WeightsChecker(model_tensors(holder.model), checksum_layout)
        self.tensors = TensorReceiver()
        self.groups = DistributedReceiver(holder.device)

    def add_to(self, app: web.Application) -> None:
        routes = {
            "/update_weights_from_tensor": self.update_weights_from_tensor,
            "/init_weights_update_group": self.init_weights_update_group,
            "/update_weights_from_distributed": self.update_weights_from_distributed,
            "/destroy_weights_update_group": self.destroy_weights_update_group,
            "/update_weights_from_disk": self.update_weights_from_disk,
        }
        for path, handler in routes.items():
            app.router.add_post(path, handler)
        app.router.add_get("/weights_checker", self.weights_checker)  # SGLang 0.5.14: GET or POST
        app.router.add_post("/weights_checker", self.weights_checker)
        app.router.add_get("/get_weight_version", self.get_weight_version)

    async def _load(self, body: dict[str, Any], receive: Callable[[], NamedTensors], **extra: Any) -> web.Response:
        """Receive and copy into the model with generation held off; the device copies finish before the
        answer, so the sender may reuse the memory it shared as soon as it has it. ``torch_empty_cache``
        empties the CUDA cache with the cache flush, as SGLang does (only when ``flush_cache``)."""
        version = _version(body)
        if body.get("abort_all_requests"):
            self.abort_all()
        empty_cache = body.get("flush_cache", True) and body.get("torch_empty_cache", False)

        def apply() -> int:
            named = receive()
            self.holder.update_weights_from_tensors(named, version=version)
            if self.holder.device.type == "cuda":
                torch.cuda.synchronize(self.holder.device)
                if empty_cache:
                    torch.cuda.empty_cache()
            return len(named)

        count = await self.run(apply)
        return _answer(True, f"Succeeded to update {count} tensors" + (f"; weight version {version}" if version
                                                                          is not None else ""), **extra)

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        body = checked("/update_weights_from_tensor", await self.body(request))
        return await self._load(body, lambda: self.tensors.named_tensors(body))

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        body = checked("/init_weights_update_group", await self.body(request))
        message = await asyncio.get_running_loop().run_in_executor(None, lambda: self.groups.init(body))
        return _answer(True, message)

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = checked("/update_weights_from_distributed", await self.body(request))
        return await self._load(body, lambda: self.groups.named_tensors(body))

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        body = checked("/destroy_weights_update_group", await self.body(request))
        name = body.get("group_name", "weight_update_group")
        found = await asyncio.get_running_loop().run_in_executor(None, self.groups.destroy, name)
        return _answer(found, f"destroyed {name}" if found else f"no weight update group {name!r}")

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        from relax.weights.hf_files import read_hf_dir

        body = checked("/update_weights_from_disk", await self.body(request))
        try:  # SGLang's answer carries num_paused_requests (0: this engine pauses nothing to load), 400 on failure
            response = await self._load(body, lambda: read_hf_dir(body["model_path"]), num_paused_requests=0)
        except (OSError, ValueError) as exc:
            return _answer(False, f"Failed to load {body['model_path']}: {exc}", num_paused_requests=0)
        if body.get("torch_empty_cache") and self.holder.device.type == "cuda":
            torch.cuda.empty_cache()
        return response

    async def weights_checker(self, request: web.Request) -> web.Response:
        """GET or POST; no body (or no ``action``) is SGLang's default action, ``checksum``."""
        body = checked("/weights_checker", await self.body(request))
        action = body.get("action", ENDPOINTS_BY_PATH["/weights_checker"].fields["action"])
        result = await self.run(lambda: self.checker.run(action))
        return _answer(**result)

    async def get_weight_version(self, request: web.Request) -> web.Response:
        """SGLang before 0.5.10 (0.5.10 and 0.5.14 answer 404 here and at /weight_version, and report the
        version in /model_info, which relax's client reads): kept for clients of those versions."""
        return json_response({"weight_version": str(self.holder.weight_version)})
