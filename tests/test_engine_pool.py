"""HttpEnginePool: an engine's 5xx without fault tolerance ends the rollout with the fleet's one line."""
import asyncio

import pytest

from relax.engine.rollout.engine_pool import EngineDiedError, HttpEnginePool
from relax.utils.http_utils import EngineHTTPError, run_closing


class FailingClient:
    async def generate(self, request):
        raise EngineHTTPError("http://127.0.0.1:1", 500, "engine step failed: RuntimeError: boom")


def test_a_5xx_ends_the_rollout_with_the_failure_line_even_when_naming_the_engine_runs_a_loop() -> None:
    """EngineFleet.failure asks the engines' /health on an event loop of its own (run_closing): called from
    inside the rollout's loop that raised "asyncio.run() cannot be called from a running event loop" instead of
    the line naming the engine (seen on the H200 when a VLM prefill raised)."""
    def failure(exc: BaseException) -> EngineDiedError:
        async def ask() -> bool:
            return True
        assert run_closing(ask())  # what EngineFleet.failure does when the error names no engine URL
        return EngineDiedError(f"engine:0 failed: {str(exc).splitlines()[0]}")

    pool = HttpEnginePool(FailingClient(), on_failure=failure)
    with pytest.raises(EngineDiedError, match="engine:0 failed: .*HTTP 500: engine step failed: RuntimeError: boom"):
        asyncio.run(pool.generate({"input_ids": [1], "sampling_params": {}}))
