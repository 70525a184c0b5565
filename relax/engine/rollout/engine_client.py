"""The HTTP client of an engine server (the embedded engine or a real SGLang server) or of the router.

Every endpoint of the engine contract (DESIGN.md) has a typed method whose request body uses
SGLang's field names (`relax.engine.protocol`): what it sends the embedded engine is what it sends
SGLang. Each call has a timeout, so a killed or hung engine surfaces as `EngineError` naming its
address, never a hang. Weight versions travel as strings (SGLang's ``weight_version`` is a string)
and come back as integers (`relax.engine.protocol.parse_weight_version`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from relax.engine.protocol import parse_weight_version, weight_version_str
from relax.utils.gather import gather_or_cancel
from relax.utils.http_utils import EngineError, EngineHTTPError, post, poster_installed, request

__all__ = ["EngineClient", "EngineError", "EngineHTTPError"]


class EngineClient:
    """Async client of one engine (or router) at ``base_url``.

    ``timeout`` bounds generation calls (``None`` = unbounded, rely on health checks),
    ``control_timeout`` every other call, ``weights_timeout`` weight updates.
    """

    def __init__(self, base_url: str, *, api_key: str | None = None, timeout: float | None = 600.0,
                 control_timeout: float = 30.0, weights_timeout: float = 600.0, proxy: str | None = None):
        self.base_url = base_url.rstrip("/")
        self.proxy = proxy  # an HTTP proxy URL every call goes through (--http-proxy, for a server outside the run)
        if "://" not in self.base_url:
            self.base_url = f"http://{self.base_url}"
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else None
        self.timeout = timeout
        self.control_timeout = control_timeout
        self.weights_timeout = weights_timeout

    def __repr__(self) -> str:
        return f"EngineClient({self.base_url!r})"

    async def _call(self, method: str, path: str, payload: Any = None, timeout: float | None = None) -> Any:
        return await request(method, f"{self.base_url}{path}", payload, timeout=timeout, headers=self.headers,
                             proxy=self.proxy)

    async def _post(self, path: str, payload: dict[str, Any] | None = None, *, timeout: float | None = None) -> Any:
        body = {k: v for k, v in (payload or {}).items() if v is not None}  # None: SGLang's default applies
        return await self._call("POST", path, body, self.control_timeout if timeout is None else timeout)

    # ------------------------------------------------------------------ generation
    async def generate(self, request_or_batch: dict[str, Any] | list[dict[str, Any]]) -> Any:
        """One SGLang-shaped request -> its response; a list -> the list of responses (one call each)."""
        if isinstance(request_or_batch, list):
            return list(await gather_or_cancel(*(self.generate(r) for r in request_or_batch)))
        if poster_installed():  # --use-distributed-post: a poster actor makes it (engine/rollout/distributed_post.py)
            return await post(f"{self.base_url}/generate", request_or_batch, timeout=self.timeout,
                              headers=self.headers, proxy=self.proxy)
        return await self._call("POST", "/generate", request_or_batch, self.timeout)

    async def abort_request(self, rid: str | None = None, *, abort_all: bool = False) -> Any:
        return await self._post("/abort_request", {"rid": rid, "abort_all": abort_all or None})

    async def pause_generation(self, mode: str = "abort") -> Any:
        """``abort`` (SGLang's default): abort running requests; ``in_place``: keep them; ``retract``: requeue."""
        return await self._post("/pause_generation", {"mode": mode})

    async def continue_generation(self) -> Any:
        return await self._post("/continue_generation")

    async def flush_cache(self) -> str:
        """SGLang answers in plain text (``Cache flushed. ...``; 400 with its reason while requests run)."""
        return await request("POST", f"{self.base_url}/flush_cache", {}, timeout=self.control_timeout,
                             headers=self.headers, text=True, proxy=self.proxy)

    # ------------------------------------------------------------------ profiling
    async def start_profile(self, body: dict[str, Any]) -> str:
        """SGLang's ``/start_profile`` with a ``ProfileReqInput`` body (None fields: SGLang's defaults); SGLang
        answers in plain text."""
        body = {k: v for k, v in body.items() if v is not None}
        return await request("POST", f"{self.base_url}/start_profile", body, timeout=self.control_timeout,
                             headers=self.headers, text=True)

    async def stop_profile(self) -> str:
        return await request("POST", f"{self.base_url}/stop_profile", {}, timeout=self.weights_timeout,
                             headers=self.headers, text=True)

    # ------------------------------------------------------------------ weights
    async def update_weights_from_tensor(self, serialized_named_tensors: Sequence[str], *,
                                         load_format: str | None = None, flush_cache: bool = True,
                                         weight_version: int | str | None = None,
                                         abort_all_requests: bool = False) -> Any:
        """``serialized_named_tensors``: one item per tensor-parallel rank (`relax.weights.serialized_tensors`)."""
        return await self._post("/update_weights_from_tensor", {
            "serialized_named_tensors": list(serialized_named_tensors), "load_format": load_format,
            "flush_cache": flush_cache, "abort_all_requests": abort_all_requests or None,
            "weight_version": weight_version_str(weight_version)}, timeout=self.weights_timeout)

    async def update_weights_from_disk(self, model_path: str, *, load_format: str | None = None,
                                       weight_version: int | str | None = None, flush_cache: bool = True) -> Any:
        return await self._post("/update_weights_from_disk", {
            "model_path": str(model_path), "load_format": load_format, "flush_cache": flush_cache,
            "weight_version": weight_version_str(weight_version)}, timeout=self.weights_timeout)

    async def init_weights_update_group(self, master_address: str, master_port: int, rank_offset: int,
                                        world_size: int, *, group_name: str = "weight_update_group",
                                        backend: str = "nccl") -> Any:
        return await self._post("/init_weights_update_group", {
            "master_address": master_address, "master_port": master_port, "rank_offset": rank_offset,
            "world_size": world_size, "group_name": group_name, "backend": backend}, timeout=self.weights_timeout)

    async def update_weights_from_distributed(self, names: Sequence[str], dtypes: Sequence[str],
                                              shapes: Sequence[Sequence[int]], *,
                                              group_name: str = "weight_update_group", flush_cache: bool = True,
                                              weight_version: int | str | None = None,
                                              load_format: str | None = None) -> Any:
        return await self._post("/update_weights_from_distributed", {
            "names": list(names), "dtypes": list(dtypes), "shapes": [list(s) for s in shapes],
            "group_name": group_name, "flush_cache": flush_cache, "weight_version": weight_version_str(weight_version),
            "load_format": load_format}, timeout=self.weights_timeout)

    async def destroy_weights_update_group(self, group_name: str = "weight_update_group") -> Any:
        return await self._post("/destroy_weights_update_group", {"group_name": group_name})

    async def weights_checker(self, action: str) -> dict[str, Any]:
        """SGLang's actions: snapshot, reset_tensors, compare, checksum (0.5.14's default). The embedded engine's
        ``checksum`` answer also carries relax's per-tensor checksums at the top level (`checksums`)."""
        return await self._post("/weights_checker", {"action": action}, timeout=self.weights_timeout)

    async def checksums(self) -> dict[str, str]:
        """Per-tensor checksums (the embedded engine's ``checksum`` action; `relax.weights.checksum`). A real SGLang
        answer has only ``ranks[*].checksums``, hashes of its own parameter layout: never read as relax's."""
        answer = await self.weights_checker("checksum")
        if not isinstance(answer, dict) or not isinstance(answer.get("checksums"), dict):
            raise EngineError(self.base_url, "weights_checker checksum returned no checksums")
        return answer["checksums"]

    async def sglang_checksums(self, tp_size: int = 1) -> dict[str, str]:
        """A stock SGLang server's own hashes of its parameters (the ``checksum`` answer's ``ranks``: one per
        tensor-parallel rank, whose names get ``tp<r>/`` before them beyond one rank;
        `relax.weights.sglang_checksums` computes the trainer's side)."""
        answer = await self.weights_checker("checksum")
        ranks = answer.get("ranks") if isinstance(answer, dict) else None
        if (not isinstance(ranks, list) or len(ranks) != tp_size
                or not all(isinstance(r, dict) and isinstance(r.get("checksums"), dict) for r in ranks)):
            raise EngineError(self.base_url, f"weights_checker checksum: expected {tp_size} rank(s)' checksums, got "
                              f"{len(ranks) if isinstance(ranks, list) else 'no'} ranks")
        if tp_size == 1:
            return ranks[0]["checksums"]
        order = sorted(ranks, key=lambda r: (r.get("parallelism_info") or {}).get("tp_rank", 0))
        return {f"tp{i}/{name}": value for i, r in enumerate(order) for name, value in r["checksums"].items()}

    async def weight_version(self) -> int | None:
        """The served weights' version (SGLang reports it in ``/model_info``; None: never versioned)."""
        return parse_weight_version((await self.model_info()).get("weight_version"))

    # ------------------------------------------------------------------ memory, health, info
    async def release_memory_occupation(self, tags: Sequence[str] | None = None) -> Any:
        return await self._post("/release_memory_occupation", {"tags": list(tags) if tags else None},
                                timeout=self.weights_timeout)

    async def resume_memory_occupation(self, tags: Sequence[str] | None = None) -> Any:
        return await self._post("/resume_memory_occupation", {"tags": list(tags) if tags else None},
                                timeout=self.weights_timeout)

    async def health(self, timeout: float | None = None) -> bool:
        """True when the server answers ``/health`` with 200 within ``timeout``; never raises."""
        try:
            await self._call("GET", "/health", timeout=timeout or self.control_timeout)
            return True
        except EngineError:
            return False

    async def health_generate(self, timeout: float | None = None) -> Any:
        return await self._call("GET", "/health_generate", timeout=timeout or self.control_timeout + 60)

    async def model_info(self) -> dict[str, Any]:
        """``/model_info`` (SGLang >= 0.5.10), else the older ``/get_model_info``."""
        return await self._info("/model_info", "/get_model_info")

    async def server_info(self) -> dict[str, Any]:
        """``/server_info`` (SGLang >= 0.5.10), else the older ``/get_server_info``."""
        return await self._info("/server_info", "/get_server_info")

    async def _info(self, path: str, older: str) -> dict[str, Any]:
        try:
            return await self._call("GET", path, timeout=self.control_timeout)
        except EngineHTTPError as exc:
            if exc.status != 404:
                raise
            return await self._call("GET", older, timeout=self.control_timeout)

    async def wait_healthy(self, timeout: float = 120.0, interval: float = 0.2) -> None:
        """Poll ``/health`` until it answers; `EngineError` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if await self.health(timeout=min(5.0, max(0.1, deadline - time.monotonic()))):
                return
            await asyncio.sleep(interval)
        raise EngineError(self.base_url, f"not healthy within {timeout} s")
