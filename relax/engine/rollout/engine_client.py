"""The production HTTP client of an engine server: the embedded engine or real SGLang.

Every endpoint of the engine contract (DESIGN.md) has a typed method. Each call has a timeout,
so a killed or hung engine surfaces as `EngineError` naming its address, never a hang.

Weight sync helpers:

* `EngineClient.update_weights_from_tensor` sends a bucket either serialized in the request
  (works across hosts) or through a shared-memory file (same host, ``via="shm"``).
* `DistributedWeightSender` is the trainer side of ``/update_weights_from_distributed``: it
  hosts the broadcast group (rank 0) and streams tensors to every engine at once.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Sequence
from typing import Any

import torch

from relax.backends.embedded import weight_transport as wt
from relax.utils.http_utils import EngineError, EngineHTTPError, request

__all__ = ["DistributedWeightSender", "EngineClient", "EngineError", "EngineHTTPError", "HttpEnginePool"]


class EngineClient:
    """Async client of one engine (or router) at ``base_url``.

    ``timeout`` bounds generation calls (``None`` = unbounded, rely on health checks),
    ``control_timeout`` every other call, ``weights_timeout`` weight updates.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float | None = 600.0,
                 control_timeout: float = 30.0, weights_timeout: float = 600.0):
        self.base_url = base_url.rstrip("/")
        if "://" not in self.base_url:
            self.base_url = f"http://{self.base_url}"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.timeout = timeout
        self.control_timeout = control_timeout
        self.weights_timeout = weights_timeout

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r})"

    async def _call(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> Any:
        return await request(method, f"{self.base_url}{path}", payload, timeout=timeout, headers=self.headers)

    async def _post(self, path: str, payload: Any = None, *, timeout: float | None = None) -> Any:
        return await self._call("POST", path, payload if payload is not None else {},
                                self.control_timeout if timeout is None else timeout)

    # ------------------------------------------------------------------ generation
    async def generate(self, request_or_batch: dict[str, Any] | list[dict[str, Any]]) -> Any:
        """One SGLang-shaped request -> its response; a list -> the list of responses (one call each)."""
        if isinstance(request_or_batch, list):
            return list(await asyncio.gather(*(self.generate(r) for r in request_or_batch)))
        return await self._call("POST", "/generate", request_or_batch, self.timeout)

    async def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> dict[str, Any]:
        payload: dict[str, Any] = {"abort_all": abort_all}
        if rid is not None:
            payload["rid"] = rid
        return await self._post("/abort_request", payload)

    async def pause_generation(self, mode: str = "abort") -> dict[str, Any]:
        """``abort`` (SGLang's default): abort running requests and pause; ``in_place``: keep them."""
        return await self._post("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> dict[str, Any]:
        return await self._post("/continue_generation")

    async def flush_cache(self) -> dict[str, Any]:
        return await self._post("/flush_cache")

    # ------------------------------------------------------------------ weights
    async def update_weights_from_tensor(self, named_tensors: Iterable[tuple[str, torch.Tensor]] | dict, *,
                                         version: int | None = None, via: str = "serialized") -> dict[str, Any]:
        named = list(named_tensors.items() if isinstance(named_tensors, dict) else named_tensors)
        payload: dict[str, Any] = {"weight_version": version}
        if via == "shm":
            path = await asyncio.to_thread(wt.write_shm, named)
            try:
                return await self._post("/update_weights_from_tensor",
                                         {**payload, "load_format": "shm", "path": str(path)},
                                         timeout=self.weights_timeout)
            finally:
                path.unlink(missing_ok=True)
        if via != "serialized":
            raise ValueError(f"via must be 'serialized' or 'shm', got {via!r}")
        item = await asyncio.to_thread(wt.encode_named_tensors, named)
        return await self._post("/update_weights_from_tensor", {**payload, "serialized_named_tensors": [item]},
                                timeout=self.weights_timeout)

    async def update_weights_from_disk(self, model_path: str | os.PathLike, *, version: int | None = None
                                       ) -> dict[str, Any]:
        return await self._post("/update_weights_from_disk", {"model_path": str(model_path), "weight_version": version},
                                timeout=self.weights_timeout)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, *, group_name: str = "weight_update_group",
                                        backend: str | None = None) -> dict[str, Any]:
        payload = {"master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
                   "world_size": world_size, "group_name": group_name}
        if backend is not None:
            payload["backend"] = backend
        return await self._post("/init_weights_update_group", payload, timeout=self.weights_timeout)

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], *, version: int | None = None,
                                              group_name: str = "weight_update_group") -> dict[str, Any]:
        payload = {"names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
                   "group_name": group_name, "weight_version": version}
        return await self._post("/update_weights_from_distributed", payload, timeout=self.weights_timeout)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> dict[str, Any]:
        return await self._post("/destroy_weights_update_group", {"group_name": group_name})

    async def get_weight_version(self) -> int:
        return int((await self._call("GET", "/get_weight_version", timeout=self.control_timeout))["weight_version"])

    async def weights_checker(self, action: str, **kwargs: Any) -> dict[str, Any]:
        return await self._post("/weights_checker", {"action": action, **kwargs}, timeout=self.weights_timeout)

    async def checksums(self) -> dict[str, str]:
        return (await self.weights_checker("checksum"))["checksums"]

    # ------------------------------------------------------------------ memory, health, info
    async def release_memory_occupation(self) -> dict[str, Any]:
        return await self._post("/release_memory_occupation", timeout=self.weights_timeout)

    async def resume_memory_occupation(self) -> dict[str, Any]:
        return await self._post("/resume_memory_occupation", timeout=self.weights_timeout)

    async def health(self, timeout: float | None = None) -> bool:
        """True when the server answers ``/health`` with 200 within ``timeout``; never raises."""
        try:
            await self._call("GET", "/health", timeout=timeout or self.control_timeout)
            return True
        except EngineError:
            return False

    async def health_generate(self) -> dict[str, Any]:
        return await self._call("GET", "/health_generate", timeout=self.control_timeout + 60)

    async def server_info(self) -> dict[str, Any]:
        return await self._call("GET", "/get_server_info", timeout=self.control_timeout)

    async def wait_healthy(self, timeout: float = 120.0, interval: float = 0.2) -> None:
        """Poll ``/health`` until it answers; `EngineError` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.health(timeout=min(5.0, max(0.1, deadline - time.monotonic()))):
                return
            await asyncio.sleep(interval)
        raise EngineError(self.base_url, f"not healthy within {timeout} s")


class DistributedWeightSender:
    """Trainer side of ``/update_weights_from_distributed`` (rank 0 of a broadcast group).

    ``engines`` each join with rank ``1 + i`` (one process per engine)::

        sender = await DistributedWeightSender.connect(clients, "127.0.0.1", port)
        await sender.send(model.state_dict().items(), version=3)
    """

    def __init__(self, clients: list[EngineClient], group: wt.WeightGroup):
        self.clients = clients
        self.group = group

    @classmethod
    async def connect(cls, clients: list[EngineClient], master_address: str, master_port: int, *,
                      group_name: str = "weight_update_group", backend: str = "gloo",
                      timeout_s: float = 300.0) -> DistributedWeightSender:
        world = len(clients) + 1
        own = asyncio.create_task(asyncio.to_thread(
            wt.WeightGroup, master_address, master_port, 0, world, group_name=group_name, backend=backend,
            timeout_s=timeout_s))
        joins = [c.init_weights_update_group(master_address, master_port, 1 + i, world, group_name=group_name,
                                             backend=backend) for i, c in enumerate(clients)]
        results = await asyncio.gather(own, *joins, return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return cls(clients, results[0])

    async def send(self, named_tensors: Iterable[tuple[str, torch.Tensor]], *, version: int | None = None
                   ) -> list[dict[str, Any]]:
        named = [(n, t.detach().contiguous()) for n, t in named_tensors]
        names = [n for n, _ in named]
        dtypes = [wt.dtype_name(t.dtype) for _, t in named]
        shapes = [list(t.shape) for _, t in named]
        calls = [c.update_weights_from_distributed(names, dtypes, shapes, version=version,
                                                   group_name=self.group.group_name) for c in self.clients]
        tensors = [t if self.group.backend == "nccl" else t.cpu() for _, t in named]
        results = await asyncio.gather(asyncio.to_thread(self.group.broadcast, tensors, 0), *calls,
                                       return_exceptions=True)
        for r in results:
            if isinstance(r, BaseException):
                raise r
        return list(results[1:])

    def close(self) -> None:
        self.group.close()


class HttpEnginePool:
    """The HTTP counterpart of ``RayEnginePool``: a batch goes to one address (a router or an engine).

    The router balances single requests across engines, so the batch is sent as concurrent
    single requests; ``group_size`` is accepted for interface parity.
    """

    def __init__(self, client: EngineClient):
        self.client = client

    async def generate_batch(self, requests: list[dict[str, Any]], group_size: int = 1) -> list[dict[str, Any]]:
        return await self.client.generate(list(requests))
