"""The elastic fleet's logic without engines: drain/abort, the partial-success policies, the scaler's steps over a
fake fleet, the router's draining state, the control endpoint's auth, and the rollout's return of aborted samples."""

from __future__ import annotations

import asyncio
import threading
import time
from types import SimpleNamespace

import pytest

from relax.core import elastic
from relax.core.elastic import ElasticConfig, FleetScaler, PartialSuccessPolicy, ScaleError, decide, drain
from relax.engine.launcher import EngineRecord
from relax.engine.router.router import NoWorker, Router
from relax.utils.flag_types import ConfigError
from relax.weights.transports import SyncTarget


def cfg(**kw) -> ElasticConfig:
    base = dict(scale_out_timeout=5.0, scale_out_partial_success_policy="rollback_all", scale_in_drain_timeout=0.5,
                scale_in_shutdown_timeout=1.0, fleet_control_addr=None, fleet_control_api_key=None)
    return ElasticConfig.from_args(SimpleNamespace(**{**base, **kw}))


# ---------------------------------------------------------------------------------------------- pure steps
def test_decide_policies():
    assert decide(PartialSuccessPolicy.ROLLBACK_ALL, [1, 3], {}) == ([1, 3], [])
    assert decide(PartialSuccessPolicy.ROLLBACK_ALL, [1], {2: "unhealthy"}) == ([], [1, 2])
    assert decide(PartialSuccessPolicy.KEEP_PARTIAL, [1], {2: "unhealthy"}) == ([1], [2])
    assert decide(PartialSuccessPolicy.KEEP_PARTIAL, [], {1: "x", 2: "y"}) == ([], [1, 2])


def test_drain_finishes_without_abort():
    left = {"a": 2}
    aborted = []

    def finish() -> None:
        time.sleep(0.1)
        left["a"] = 0

    threading.Thread(target=finish).start()
    assert drain(["a"], left.get, aborted.append, drain_timeout=2.0) == {"a": 0}
    assert aborted == []


def test_drain_aborts_what_is_left_and_waits_for_answers():
    left = {"a": 3, "b": 0}
    aborted = []

    def abort(url: str) -> None:
        aborted.append(url)
        left[url] = 0  # the engine answers the aborted requests

    start = time.monotonic()
    assert drain(["a", "b"], left.get, abort, drain_timeout=0.2) == {"a": 3, "b": 0}
    assert aborted == ["a"] and time.monotonic() - start < 2.0


def test_drain_is_bounded_when_an_abort_is_never_answered():
    start = time.monotonic()
    assert drain(["a"], lambda u: 1, lambda u: None, drain_timeout=0.1, settle_timeout=0.2) == {"a": 1}
    assert time.monotonic() - start < 1.5


def test_config_checks_policy_and_bind():
    with pytest.raises(ValueError):
        cfg(scale_out_partial_success_policy="some")
    with pytest.raises(ConfigError, match="not loopback: --fleet-control-api-key is required"):
        cfg(fleet_control_addr="0.0.0.0:0")
    with pytest.raises(ConfigError, match="expected HOST:PORT"):
        cfg(fleet_control_addr="nowhere")
    assert cfg(fleet_control_addr="0.0.0.0:0", fleet_control_api_key="k").keeps_snapshot


# ---------------------------------------------------------------------------------------------- router
def test_router_draining_worker_gets_no_new_request():
    router = Router(["http://a", "http://b"])
    assert router.drain_worker("http://a")
    assert all(router.pick().url == "http://b" for _ in range(3))
    router.drain_worker("http://b")
    with pytest.raises(NoWorker):
        router.pick()
    assert not router.drain_worker("http://c") and router.outstanding("http://c") == 0


# ---------------------------------------------------------------------------------------------- the scaler
class FakeEvents(list):
    def event(self, name, **fields):
        self.append({"event": name, **fields})

    def named(self, name):
        return [e for e in self if e["event"] == name]


class FakeLauncher:
    name, can_restart, graceful_stop = "embedded", True, None

    def __init__(self, broken=()):
        from relax.distributed.placement import Slot

        self.slots = [Slot("engine:0", 0, {"num_cpus": 0}, None)]
        self.broken, self.abandoned = set(broken), []

    def begin(self, indices):
        return indices

    def finish(self, pending):
        (i,) = pending
        if i in self.broken:
            raise RuntimeError(f"engine:{i} died at start")
        return [EngineRecord(i, SyncTarget(f"engine:{i}", f"http://e{i}", "cpu"))]

    def abandon(self, pending):
        self.abandoned += list(pending)


class FakeRouter:
    def __init__(self):
        self.workers, self.draining, self.busy = [], [], {}

    def drain_worker(self, url):
        self.draining.append(url)

    def outstanding(self, url):
        return self.busy.get(url, 0)


class FakeFleet:
    def __init__(self, launcher):
        from relax.core.engines import EngineFleet

        self.launcher, self.router = launcher, FakeRouter()
        self.records = [EngineRecord(0, SyncTarget("engine:0", "http://e0", "cpu"))]
        self.new_indices = lambda n: EngineFleet.new_indices(self, n)
        self.live_records = lambda: EngineFleet.live_records(self)

    def join(self, record):
        from relax.core.engines import EngineFleet

        EngineFleet.join(self, record)

    def admit(self, index):
        self.router.workers.append(self.records[index].target.url)

    def drop(self, index):
        from dataclasses import replace

        r = self.records[index]
        self.records[index] = replace(r, target=replace(r.target, side=f"gone:{index}"))

    def client(self, index, **kw):
        fleet = self

        class Client:
            async def abort_request(self, abort_all=False):
                fleet.router.busy[fleet.records[index].target.url] = 0

        return Client()


class FakeRuntime:
    def __init__(self, launcher, sync_fails=False):
        self.fleet, self.artifacts = FakeFleet(launcher), FakeEvents()
        self.weights_lock, self.version, self.synced = threading.RLock(), 4, []
        self.sync_fails = sync_fails

    def resync_targets(self, targets, timeout_s=None):
        if self.sync_fails:
            raise TimeoutError("trainer did not answer")
        self.synced.append([t.side for t in targets])


@pytest.fixture(autouse=True)
def healthy(monkeypatch):
    monkeypatch.setattr(elastic, "_wait_generating", lambda record, deadline: None)


def test_scale_out_joins_after_the_weights():
    rt = FakeRuntime(FakeLauncher())
    result = FleetScaler(rt, cfg()).scale_out(2)
    assert result["joined"] == [1, 2] and rt.synced == [["engine:1", "engine:2"]]
    assert rt.fleet.router.workers == ["http://e1", "http://e2"]
    assert [e["version"] for e in rt.artifacts.named("engine_joined")] == [4, 4]


def test_scale_out_rollback_all_removes_every_joiner():
    launcher = FakeLauncher(broken={2})
    rt = FakeRuntime(launcher)
    result = FleetScaler(rt, cfg()).scale_out(2)
    assert result["joined"] == [] and result["removed"] == [1, 2] and "engine:2 died at start" in result["failed"]["2"]
    assert rt.fleet.router.workers == [] and len(rt.fleet.live_records()) == 1
    decision = rt.artifacts.named("scale_out_decision")[0]
    assert decision["removed"] == ["engine:1", "engine:2"] and decision["policy"] == "rollback_all"
    assert launcher.abandoned == [2]


def test_scale_out_keep_partial_keeps_the_healthy_one():
    rt = FakeRuntime(FakeLauncher(broken={1}))
    result = FleetScaler(rt, cfg(scale_out_partial_success_policy="keep_partial")).scale_out(2)
    assert result["joined"] == [2] and result["removed"] == [1]
    assert [r.target.side for r in rt.fleet.live_records()] == ["engine:0", "engine:2"]
    assert FleetScaler(rt, cfg()).fleet.new_indices(1) == [3]  # a failed joiner's index is never reused


def test_scale_out_that_cannot_sync_is_rolled_back():
    rt = FakeRuntime(FakeLauncher(), sync_fails=True)
    result = FleetScaler(rt, cfg(scale_out_partial_success_policy="keep_partial")).scale_out(1)
    assert result["joined"] == [] and "weight sync failed: TimeoutError" in result["failed"]["1"]


def test_scale_out_deadline_counts_a_slow_start_as_failed(monkeypatch):
    launcher = FakeLauncher()
    slow = launcher.finish

    def finish(pending):
        if pending == [2]:
            time.sleep(1.0)
        return slow(pending)

    launcher.finish = finish
    rt = FakeRuntime(launcher)
    start = time.monotonic()
    result = FleetScaler(rt, cfg(scale_out_timeout=0.3, scale_out_partial_success_policy="keep_partial")).scale_out(2)
    assert time.monotonic() - start < 0.9
    assert result["joined"] == [1] and "--scale-out-timeout 0.3 s" in result["failed"]["2"]


def test_scale_in_drains_aborts_and_drops(monkeypatch):
    stops = []
    monkeypatch.setattr(elastic, "stop_actor", lambda actor, timeout, graceful=None: stops.append(actor) or "killed")
    rt = FakeRuntime(FakeLauncher())
    scaler = FleetScaler(rt, cfg(scale_in_drain_timeout=0.1))
    scaler.scale_out(2)
    rt.fleet.records[1].actor = "actor-1"
    rt.fleet.router.busy["http://e1"] = 2  # two requests in flight past the drain deadline
    result = scaler.scale_in([1])
    assert rt.fleet.router.draining == ["http://e1"] and result["aborted"] == {"1": 2}
    assert [r.index for r in rt.fleet.live_records()] == [0, 2] and stops == ["actor-1"]
    left = rt.artifacts.named("engine_left")[0]
    assert left["stop"] == "killed" and left["aborted"] == 2 and rt.artifacts.named("scale_in_abort")


def test_scale_in_refuses_unknown_or_all_engines():
    rt = FakeRuntime(FakeLauncher())
    scaler = FleetScaler(rt, cfg())
    with pytest.raises(ScaleError, match="engine:5 is not in the fleet"):
        scaler.scale_in([5])
    with pytest.raises(ScaleError, match="would leave none"):
        scaler.scale_in([0])


# ---------------------------------------------------------------------------------------------- the rollout
def test_default_rollout_returns_aborted_groups_to_the_buffer(monkeypatch):
    from relax.engine.rollout import sglang_rollout
    from relax.utils.types import Sample

    drawn = []

    class Source:
        def __init__(self):
            self.back = []

        def get_samples(self, n):
            if self.back:
                groups, self.back = self.back, []
                return groups
            group = [Sample(index=len(drawn), group_index=len(drawn), tokens=[1, 2])]
            drawn.append(group)
            return [group]

        def add_samples(self, groups):
            self.back += groups

    calls = {"n": 0}

    async def generate(cfg, rewards, rollout_id, state, groups):
        calls["n"] += 1
        for g in groups:
            for s in g:
                s.status = Sample.Status.ABORTED if calls["n"] == 1 else Sample.Status.COMPLETED
                s.tokens = s.tokens + [7]
                s.response_length = 1

    records = []
    state = SimpleNamespace(record=lambda step, group, fate, reason: records.append((fate, reason)))
    monkeypatch.setattr(sglang_rollout, "_generate_and_score", generate)
    monkeypatch.setattr(sglang_rollout, "GenerateState", lambda args, config=None: state)
    monkeypatch.setattr(sglang_rollout, "dynamic_filter", lambda cfg: lambda g: (True, None))
    source = Source()
    rollout_cfg = SimpleNamespace(args=None, rollout_batch_size=1, draw_size=1)
    kept = asyncio.run(sglang_rollout.generate_rollout_async(rollout_cfg, None, 0, source))
    assert records == [("recycled", "engine_aborted")]
    assert len(drawn) == 1 and kept[0][0].index == 0 and kept[0][0].abort_count == 1
    assert kept[0][0].tokens == [1, 2, 7]  # generated again from its prompt


# ---------------------------------------------------------------------------------------------- control endpoint
def test_control_endpoint_requires_its_key_and_answers_in_one_line():
    import json
    import urllib.error
    import urllib.request

    from relax.core.fleet_control import FleetControl

    rt = FakeRuntime(FakeLauncher())
    control = FleetControl.start(FleetScaler(rt, cfg(fleet_control_addr="127.0.0.1:0", fleet_control_api_key="k")))

    def post(path, body, key=None):
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        req = urllib.request.Request(control.url + path, data=json.dumps(body).encode(), headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    try:
        assert post("/scale_out", {"count": 1})[0] == 401
        assert post("/scale_out", {"count": "two"}, "k") == (400, {"error": {
            "message": "/scale_out: 'count' must be an int", "code": 400}})
        status, answer = post("/scale_out", {"count": 1}, "k")
        assert status == 200 and answer["joined"] == [1]
        status, answer = post("/scale_in", {"indices": [0, 1]}, "k")
        assert status == 409 and "would leave none" in answer["error"]["message"]
    finally:
        control.stop()


def test_a_gpu_joiner_shares_a_running_engines_gpu_without_a_ray_gpu_share():
    """On a GPU run the placement groups hold no spare GPU: a joiner goes to a running engine's bundle (same node),
    takes num_gpus 0 and sees that engine's GPU through CUDA_VISIBLE_DEVICES; a joiner of a joiner keeps it."""
    from relax.distributed.placement import Slot

    strategy = object()  # the running engine's PlacementGroupSchedulingStrategy
    running = Slot("engine:0", 1, {"num_cpus": 0, "num_gpus": 0.5, "scheduling_strategy": strategy,
                                   "runtime_env": {"env_vars": {"RELAX_X": "1"}}}, "node-a")
    joiner = elastic._joiner_slot(running, 3, ["2"])
    assert joiner.name == "engine:3" and joiner.gpus == 1 and joiner.node_id == "node-a"
    assert joiner.options["num_gpus"] == 0 and joiner.options["scheduling_strategy"] is strategy
    assert joiner.options["runtime_env"]["env_vars"] == {"RELAX_X": "1", "CUDA_VISIBLE_DEVICES": "2"}
    assert running.options["runtime_env"]["env_vars"] == {"RELAX_X": "1"}  # the running engine's slot is untouched
    assert elastic._visible_gpus(joiner, EngineRecord(3, SyncTarget("engine:3", "http://e3", "cuda"))) == ["2"]
    with pytest.raises(ScaleError, match=r"engine:4 would share shows GPUs none, not the 1 its slot computes on"):
        elastic._joiner_slot(running, 4, [])
    cpu = elastic._joiner_slot(Slot("engine:0", 0, {"num_cpus": 0}, None), 5, [])
    assert cpu.options == {"num_cpus": 0} and cpu.gpus == 0
