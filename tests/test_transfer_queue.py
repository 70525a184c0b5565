"""The fully-async data queue (relax/core/transfer_queue.py) against a real local Ray cluster."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
import ray

import relax.core.transfer_queue as tq
from relax.core.transfer_queue import DataQueue
from tests.e2e_helpers import in_process_ray

pytestmark = [pytest.mark.ray]
TIMEOUT_S = 60  # far above any honest wait here: reaching it means a hang


@pytest.fixture(scope="module", autouse=True)
def local_ray(tmp_path_factory: pytest.TempPathFactory):
    yield from in_process_ray(tmp_path_factory.mktemp("tq"))


@pytest.fixture
def queues():
    made: list[DataQueue] = []

    def make(*args, **kwargs) -> DataQueue:
        made.append(DataQueue(*args, **kwargs))
        return made[-1]

    yield make
    for q in made:
        q.close()


def _samples(group_sizes: list[int], step: int = 0) -> list[tuple[int, int, int]]:
    """(step, group, index in group): enough to check both order and group integrity."""
    return [(step, g, i) for g, size in enumerate(group_sizes) for i in range(size)]


def _in_thread(fn) -> tuple[threading.Thread, dict]:
    out: dict = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - inspected by the test
            out["error"] = exc

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


@pytest.mark.parametrize("num_units", [1, 2, 3])
def test_shards_keep_groups_whole_and_fetch_restores_order(queues, num_units: int) -> None:
    q = queues(num_units)
    layouts = {0: [4] * 5, 1: [3, 1, 4, 2]}  # both steps held at once; uneven group counts per unit
    stored = {step: q.put(step, _samples(sizes, step), sizes) for step, sizes in layouts.items()}
    for step, sizes in layouts.items():
        assert stored[step].fetch() == _samples(sizes, step)
        for u, unit in enumerate(q.units):
            counts = Counter(g for _, g, _ in ray.get(unit.get.remote(step))[u])
            assert counts == {g: n for g, n in enumerate(sizes) if g % num_units == u}, (step, u)
    fetch = ray.remote(lambda batch: batch.fetch())  # pickles with its unit handles, fetched in another worker
    assert ray.get(fetch.remote(stored[1])) == _samples(layouts[1], 1)
    held = q.stats()
    assert sum(s["samples"] for s in held) == 20 + 10 and all(s["steps"] == 2 and s["bytes"] > 0 for s in held)
    q.drop(0)
    assert sum(s["samples"] for s in q.stats()) == 10
    q.drop(1)
    assert q.stats() == [{"steps": 0, "shards": 0, "samples": 0, "bytes": 0}] * num_units


@pytest.mark.parametrize("polling", [True, False], ids=["polling", "blocking"])
def test_both_modes_deliver_every_step(queues, monkeypatch: pytest.MonkeyPatch, polling: bool) -> None:
    # a blocking wait that missed put's notification would sleep this long: the join below fails first
    monkeypatch.setattr(tq, "_LIVENESS_CHECK_S", 3600.0)
    q = queues(1, polling=polling)
    steps = 3

    def consume() -> list:
        got = []
        for step in range(steps):
            got.append(q.wait_meta(step).fetch())
            q.drop(step)
        return got

    consumer, out = _in_thread(consume)
    for step in range(steps):  # the consumer is already waiting when each step is put
        q.put(step, _samples([2, 2, 2], step), [2, 2, 2])
    consumer.join(TIMEOUT_S)
    assert not consumer.is_alive(), "consumer hung"
    assert out.get("value") == [_samples([2, 2, 2], step) for step in range(steps)], out
    assert all(s["samples"] == 0 for s in q.stats())


@pytest.mark.parametrize("polling", [True, False], ids=["polling", "blocking"])
def test_producer_failure_raises_in_the_consumer(queues, polling: bool) -> None:
    q = queues(1, polling=polling)
    q.put(0, _samples([1, 1]), [1, 1])

    def produce_then_fail() -> None:
        try:
            raise ValueError("reward function exploded")
        except ValueError as exc:
            q.fail(exc)

    consumer, out = _in_thread(lambda: [q.wait_meta(0).step, q.wait_meta(1)])
    threading.Thread(target=produce_then_fail).start()
    consumer.join(TIMEOUT_S)
    assert not consumer.is_alive(), "consumer hung on a failed producer"
    assert isinstance(out.get("error"), ValueError) and "exploded" in str(out["error"]), out


def test_producer_that_died_silently_or_closed_queue_raise(queues) -> None:
    q = queues(1, polling=False)
    with pytest.raises(RuntimeError, match="stopped without producing step 0"):
        q.wait_meta(0, alive=lambda: False)
    q.close()
    with pytest.raises(RuntimeError, match="closed"):
        q.wait_meta(0)
    with pytest.raises(RuntimeError, match="closed"):
        q.put(0, [1], [1])


def test_put_waits_for_a_drop_at_capacity_and_checks_group_sizes(queues) -> None:
    q = queues(1, capacity=1)
    with pytest.raises(ValueError, match="add up to 3, got 4 samples"):
        q.put(0, [1, 2, 3, 4], [2, 1])
    q.put(0, [1], [1])
    producer, out = _in_thread(lambda: q.put(1, [2], [1]).step)
    producer.join(0.5)
    assert producer.is_alive(), "put went over capacity"
    q.drop(0)
    producer.join(TIMEOUT_S)
    assert out.get("value") == 1, out
    assert q.wait_meta(1).fetch() == [2]
