"""Engine pools: how rollout code reaches the engines.

`RayEnginePool` talks to engine actors directly (SGLang-shaped request/response dicts) and
splits a batch across engines by whole groups so a group's samples share an engine. With a
supervisor (``--use-fault-tolerance``) a chunk whose engine died is re-sent to its
replacement; without one the failure ends the run with an error naming the engine.
"""

from __future__ import annotations

import asyncio
from typing import Any, Protocol

from ray.exceptions import RayActorError


class EnginePool(Protocol):
    async def generate_batch(self, requests: list[dict], group_size: int) -> list[dict]: ...


class EngineDiedError(RuntimeError):
    """An engine died mid-request and fault tolerance is off."""


class RayEnginePool:
    MAX_RETRIES = 3

    def __init__(self, engines: list, supervisor: Any = None):
        if not engines:
            raise ValueError("RayEnginePool needs at least one engine")
        self.engines = engines  # shared with the runtime: restarts replace entries in place
        self.supervisor = supervisor

    async def _generate_on(self, index: int, requests: list[dict]) -> list[dict]:
        for attempt in range(self.MAX_RETRIES + 1):
            engine = self.engines[index]
            try:
                return await engine.generate.remote(requests)
            except RayActorError as exc:
                if self.supervisor is None:
                    raise EngineDiedError(f"engine:{index} died during generation ({type(exc).__name__}); "
                                          "rerun with --use-fault-tolerance to restart engines") from None
                if attempt == self.MAX_RETRIES:
                    raise
                await asyncio.to_thread(self.supervisor.replace, index, engine, f"generate failed: {type(exc).__name__}")
        raise AssertionError("unreachable")

    async def clients(self) -> list[Any]:
        """HTTP clients of the engines, which serve SGLang's API when ``--partial-rollout`` needs aborts."""
        from relax.engine.rollout.engine_client import EngineClient

        urls = await asyncio.gather(*(e.http_url.remote() for e in self.engines))
        if None in urls:
            raise RuntimeError("the engines do not serve HTTP (started without --partial-rollout)")
        return [EngineClient(url, timeout=None) for url in urls]

    async def generate_batch(self, requests: list[dict], group_size: int) -> list[dict]:
        num_groups = max(1, len(requests) // max(1, group_size))
        per_engine = -(-num_groups // len(self.engines))  # ceil
        chunks = []
        for i in range(len(self.engines)):
            lo, hi = i * per_engine * group_size, min(len(requests), (i + 1) * per_engine * group_size)
            if lo < hi:
                chunks.append(self._generate_on(i, requests[lo:hi]))
        results = await asyncio.gather(*chunks)
        return [resp for chunk in results for resp in chunk]
