"""The router's failover on 5xx answers and dropped connections, with the harness's fault proxy in front of
one of two tiny HTTP workers (no engines: what is tested is the router's choice, not generation)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from harness.faults.proxy import FaultProxy
from relax.backends.embedded.hosting import serve_in_thread
from relax.engine.router.in_process import RouterConfig, RouterThread
from relax.utils.http_utils import EngineHTTPError, request, run_closing


def _worker(name: str, hits: dict[str, int], status: int = 200):
    app = web.Application()

    async def generate(_req):
        hits[name] += 1
        return web.json_response({"who": name, "error": {"message": "boom"}} if status >= 400 else {"who": name},
                                 status=status)

    async def health(_req):
        return web.json_response({})

    app.router.add_post("/generate", generate)
    app.router.add_get("/health", health)
    return serve_in_thread(app, name=f"worker-{name}")


def _config(failover: bool) -> RouterConfig:
    """The router's flags at their schema defaults, but for --use-fault-tolerance."""
    return RouterConfig(slime_router_health_check_failure_threshold=3, slime_router_timeout=None,
                        slime_router_max_connections=None, use_fault_tolerance=failover, use_slime_router=False,
                        slime_router_middleware_paths=None)


def _post_many(url: str, n: int) -> list:
    async def go():
        return await asyncio.gather(*(request("POST", f"{url}/generate", {"i": i}) for i in range(n)),
                                    return_exceptions=True)

    return run_closing(go())


def test_5xx_and_dropped_requests_are_retried_on_the_other_worker() -> None:
    hits = {"a": 0, "b": 0}
    a, b = _worker("a", hits), _worker("b", hits)
    proxy = FaultProxy(b.url, error_rate=0.5, drop_rate=0.5, seed=0, paths=["/generate"]).start()
    router = RouterThread([a.url, f"http://{proxy.address}"], _config(failover=True))
    try:
        answers = _post_many(router.url, 4)
    finally:
        proxy.stop()
    assert [x["who"] for x in answers] == ["a"] * 4  # every request to b failed (rates sum to 1), a served it
    assert proxy.stats["errors"] + proxy.stats["dropped"] >= 1 and hits["b"] == 0


def test_without_failover_a_5xx_answer_goes_back_and_with_it_the_last_one_does() -> None:
    hits = {"a": 0, "b": 0}
    a, b = _worker("a", hits, status=500), _worker("b", hits, status=503)
    strict = RouterThread([a.url], _config(failover=False))
    [only] = _post_many(strict.url, 1)
    assert isinstance(only, EngineHTTPError) and only.status == 500 and hits["a"] == 1
    assert f"(from engine {a.url})" in str(only)  # the router's answer names its engine (X-Relax-Worker)
    both = RouterThread([a.url, b.url], _config(failover=True))
    [last] = _post_many(both.url, 1)  # both fail: each tried once, the last answer is returned as it came
    assert isinstance(last, EngineHTTPError) and last.status in (500, 503) and "boom" in str(last)
    assert hits == {"a": 2, "b": 1}


def test_the_proxy_leaves_paths_it_is_not_told_about_alone() -> None:
    hits = {"a": 0}
    a = _worker("a", hits)
    with FaultProxy(a.url, error_rate=1.0, paths=["/generate"]) as proxy:
        async def go():
            health = await request("GET", f"http://{proxy.address}/health")
            try:
                await request("POST", f"http://{proxy.address}/generate", {})
            except EngineHTTPError as exc:
                return health, exc.status

        health, status = run_closing(go())
    assert health == {} and status == 503 and hits["a"] == 0
    assert proxy.stats == {"requests": 2, "forwarded": 1, "errors": 1}
