"""Scheduler: concurrent submitters share decode steps, seeded determinism, abort, pause, failures."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.embedded.scheduler import EngineStepError, Scheduler
from tests.test_engine_core import req, tiny_model

torch.set_num_threads(1)


@pytest.fixture
def sched():
    s = Scheduler(EmbeddedEngine(tiny_model(), eos_token_ids=[]))
    yield s
    s.close()


def test_threads_share_steps_and_keep_seeded_outputs(sched) -> None:
    solo = EmbeddedEngine(tiny_model(), eos_token_ids=[]).generate([req([4, i], seed=i, max_new=30) for i in range(8)])
    results: dict[int, dict] = {}

    def worker(i: int) -> None:
        time.sleep(0.002 * i)  # staggered arrivals join a running batch
        results[i] = sched.submit(req([4, i], seed=i, max_new=30)).result(timeout=30)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [results[i]["output_ids"] for i in range(8)] == [r["output_ids"] for r in solo]
    assert sched.steps < 8 * 30


def test_abort_pause_resume(sched) -> None:
    sched.pause()
    fut = sched.submit({**req([1, 2], seed=0, max_new=50), "rid": "x"})
    time.sleep(0.1)
    assert not fut.done() and sched.num_outstanding() == 1
    with pytest.raises(ValueError, match="already in use"):
        sched.submit({**req([1], max_new=2), "rid": "x"})
    assert sched.abort("x") == 1
    resp = fut.result(timeout=5)
    assert resp["meta_info"]["finish_reason"]["type"] == "abort" and resp["output_ids"] == []
    sched.resume()
    assert sched.submit(req([1, 2], seed=0, max_new=3)).result(timeout=10)["meta_info"]["completion_tokens"] == 3


def test_bad_request_in_batch_rejects_all(sched) -> None:
    with pytest.raises(ValueError, match="max_new_tokens"):
        sched.submit_many([req([1], max_new=2), req([1], max_new=0)])
    assert sched.num_outstanding() == 0 and not sched.engine.has_work()


def test_failing_step_fails_requests_and_keeps_serving(sched) -> None:
    real_step = sched.engine.step
    calls = {"n": 0}

    def flaky_step():
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("boom")
        return real_step()

    sched.engine.step = flaky_step
    with pytest.raises(EngineStepError, match="boom"):
        sched.submit(req([1, 2], max_new=3)).result(timeout=10)
    assert sched.submit(req([1, 2], seed=1, max_new=3)).result(timeout=10)["meta_info"]["completion_tokens"] == 3


def test_a_prefill_that_raises_fails_the_admitted_requests(sched) -> None:
    """The step admits the waiting requests before its prefill runs: a prefill that raises (a vision tower on
    another device, say) must fail them too, though no engine queue holds them any more."""
    real_prefill = sched.engine._prefill
    calls = {"n": 0}

    def flaky_prefill(reqs):
        calls["n"] += 1
        if calls["n"] == 1:
            raise RuntimeError("prefill boom")
        return real_prefill(reqs)

    sched.engine._prefill = flaky_prefill
    futures = sched.submit_many([req([1, 2], max_new=3), req([4], max_new=2)])
    for future in futures:
        with pytest.raises(EngineStepError, match="prefill boom"):
            future.result(timeout=10)
    assert sched.num_outstanding() == 0
    assert sched.submit(req([1, 2], seed=1, max_new=3)).result(timeout=10)["meta_info"]["completion_tokens"] == 3


def test_exclusive_runs_between_steps(sched) -> None:
    fut = sched.submit(req([3], seed=2, max_new=200))
    with sched.exclusive() as engine:
        n = len(engine.running[0].output_ids) if engine.running else None
        time.sleep(0.1)
        assert (len(engine.running[0].output_ids) if engine.running else None) == n
        engine.update_weights_from_tensors({}, version=5)
    assert fut.result(timeout=30)["meta_info"]["weight_version"] == "5"
