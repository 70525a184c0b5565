"""Engine pools: how rollout code reaches the engines.

`RayEnginePool` talks to engine actors directly (SGLang-shaped request/response dicts) and
splits a batch across engines by whole groups so a group's samples share an engine. An
HTTP pool over the router (same request/response shape) slots in behind the same method.
"""

from __future__ import annotations

import asyncio
from typing import Protocol


class EnginePool(Protocol):
    async def generate_batch(self, requests: list[dict], group_size: int) -> list[dict]: ...


class RayEnginePool:
    def __init__(self, engines: list):
        if not engines:
            raise ValueError("RayEnginePool needs at least one engine")
        self.engines = engines

    async def generate_batch(self, requests: list[dict], group_size: int) -> list[dict]:
        num_groups = max(1, len(requests) // max(1, group_size))
        per_engine = -(-num_groups // len(self.engines))  # ceil
        chunks = []
        for i, engine in enumerate(self.engines):
            lo, hi = i * per_engine * group_size, min(len(requests), (i + 1) * per_engine * group_size)
            if lo < hi:
                chunks.append(engine.generate.remote(requests[lo:hi]))
        results = await asyncio.gather(*chunks)
        return [resp for chunk in results for resp in chunk]
