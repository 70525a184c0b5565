"""The router in front of two embedded engines: balancing, sticky keys, pool changes, failover."""

from __future__ import annotations

import asyncio
import time

import pytest

from relax.backends.embedded.launch import EngineProcess
from relax.backends.embedded.server import FLUSHED
from relax.engine.rollout.engine_client import EngineClient, EngineHTTPError
from relax.utils.http_utils import get, post, run_closing


def gen(ids, *, seed, max_new=24):
    return {"input_ids": list(ids), "return_logprob": True,
            "sampling_params": {"max_new_tokens": max_new, "temperature": 1.0, "sampling_seed": seed}}


@pytest.fixture(scope="module")
def cluster():
    engines = [EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", "5"]) for _ in range(2)]
    router = EngineProcess.start(["--worker-urls", *(e.url for e in engines), "--health-check-interval", "0.3",
                                  "--slime-router-health-check-failure-threshold", "3"], module="relax.engine.router")
    yield router, engines
    for p in [router, *engines]:
        p.stop()


async def workers(router_url: str) -> dict[str, dict]:
    return {w["url"]: w for w in (await get(f"{router_url}/list_workers", timeout=5))["workers"]}


def test_least_outstanding_spreads_load(cluster) -> None:
    router, engines = cluster

    async def go():
        for e in engines:
            await EngineClient(e.url).pause_generation(mode="in_place")
        tasks = [asyncio.create_task(EngineClient(router.url).generate(gen([3, i], seed=i))) for i in range(6)]
        await asyncio.sleep(0.5)
        outstanding = [w["outstanding"] for w in (await workers(router.url)).values()]
        for e in engines:
            await EngineClient(e.url).continue_generation()
        done = await asyncio.gather(*tasks)
        return outstanding, done

    outstanding, done = run_closing(go())
    assert outstanding == [3, 3]
    assert len(done) == 6


def test_sticky_routing_key(cluster) -> None:
    router, _ = cluster

    async def go():
        before = {u: w["served"] for u, w in (await workers(router.url)).items()}
        for i in range(6):
            await post(f"{router.url}/generate", {**gen([7], seed=i, max_new=2), "routing_key": "session-A"})
        after = {u: w["served"] for u, w in (await workers(router.url)).items()}
        return sorted(after[u] - before[u] for u in after)

    assert run_closing(go()) == [0, 6]


def test_broadcast_and_weight_version(cluster) -> None:
    router, _ = cluster
    res = run_closing(post(f"{router.url}/flush_cache", {}))
    assert res["success"] and [w["response"] for w in res["workers"].values()] == [FLUSHED.strip()] * 2
    assert run_closing(EngineClient(router.url).weight_version()) == 0  # via /model_info, as SGLang 0.5.10 reports it
    assert run_closing(EngineClient(router.url)._call("GET", "/get_weight_version")) == {"weight_version": "0"}


def test_http_engine_pool_keeps_order(cluster) -> None:
    from relax.engine.rollout.engine_pool import HttpEnginePool

    router, (a, _) = cluster
    reqs = [gen([9, i], seed=i, max_new=6) for i in range(8)]
    got = run_closing(HttpEnginePool(EngineClient(router.url)).generate_batch(reqs, group_size=4))
    ref = run_closing(EngineClient(a.url).generate(reqs))
    assert [r["output_ids"] for r in got] == [r["output_ids"] for r in ref]


def test_remove_and_add_worker_at_run_time(cluster) -> None:
    router, engines = cluster

    async def go():
        for e in engines:
            await post(f"{router.url}/remove_worker?url={e.url}", {})
        with pytest.raises(EngineHTTPError) as exc:
            await EngineClient(router.url).generate(gen([1], seed=0, max_new=2))
        for e in engines:
            await post(f"{router.url}/add_worker?url={e.url}", {})
        resp = await EngineClient(router.url).generate(gen([1], seed=0, max_new=2))
        return exc.value, resp, await workers(router.url)

    err, resp, pool = run_closing(go())
    assert err.status == 503 and "no live worker" in err.server_message
    assert resp["meta_info"]["finish_reason"]["type"] in ("length", "stop")
    assert set(pool) == {e.url for e in engines}


def test_failover_when_a_worker_dies_mid_load(cluster) -> None:
    """Kill one of two engines while it holds requests: every request completes on the survivor."""
    router, (victim, survivor) = cluster
    requests = [gen([5, i % 7, i], seed=100 + i, max_new=40) for i in range(16)]

    async def go():
        await EngineClient(victim.url).pause_generation(mode="in_place")  # its share is in flight for sure
        client = EngineClient(router.url, timeout=60)
        tasks = [asyncio.create_task(client.generate(r)) for r in requests]
        await asyncio.sleep(0.5)
        held = (await workers(router.url))[victim.url]["outstanding"]
        victim.kill()
        results = await asyncio.gather(*tasks)
        deadline = time.monotonic() + 10
        while victim.url in await workers(router.url) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        reference = await EngineClient(survivor.url).generate(requests)
        return held, results, reference, await workers(router.url)

    held, results, reference, pool = run_closing(go())
    assert held > 0
    assert [r["output_ids"] for r in results] == [r["output_ids"] for r in reference]
    assert list(pool) == [survivor.url]  # removed after failing its health checks
