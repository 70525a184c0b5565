"""The trainer's weight push against real engine server processes: versions, checksums, snapshots, hangs.

The snapshot test is the regression for an engine restarted while the trainer is mid-step: the
restarted engine must get the last synced version's bytes, not the trainer's live weights.
"""

from __future__ import annotations

import os
import signal

import pytest
import torch

from relax.backends.embedded.launch import EngineProcess
from relax.engine.rollout.engine_client import EngineClient, EngineError
from relax.metrics.artifacts import RunArtifacts
from relax.models import build_model
from relax.utils.http_utils import run_closing
from relax.weights.checksum import state_checksums
from relax.weights.devices import device_identity
from relax.weights.push import WeightPusher
from relax.weights.sync import record_push
from tests.e2e_helpers import read_jsonl

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def engines():
    procs = [EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", str(s)]) for s in (1, 2)]
    yield procs
    for p in procs:
        p.stop()


def _target(proc: EngineProcess, side: str):
    from relax.weights.transports import SyncTarget

    return SyncTarget(side, proc.url, device_identity("cpu"))


def _buckets(state: dict, per_bucket: int = 4) -> list:
    items = list(state.items())
    return [items[i:i + per_bucket] for i in range(0, len(items), per_bucket)]


def test_push_records_equal_checksums_and_a_restart_gets_the_snapshot_not_live_weights(engines, tmp_path) -> None:
    trainer = build_model("tiny-qwen3", seed=7).state_dict()
    pusher = WeightPusher(timeout_s=60)
    artifacts = RunArtifacts(tmp_path)
    try:
        report = pusher.push(_buckets(trainer), [_target(engines[0], "engine:0")], 3, requested="auto",
                             weights_device=CPU, keep_snapshot=True)
        record_push(artifacts, report, step=2, seconds=0.1)
        assert pusher.snapshot is not None and pusher.snapshot.version == 3 and len(pusher.snapshot.buckets) > 1
        for t in trainer.values():  # the trainer is mid-step when engine 1 is (re)started
            t.add_(0.5)
        resynced = pusher.resync([_target(engines[1], "engine:1")])
        record_push(artifacts, resynced, step=3, seconds=0.1, resync=True)
    finally:
        pusher.close()
    records = read_jsonl(tmp_path / "weights.jsonl")
    assert {r["version"] for r in records} == {3} and {r["side"] for r in records} == {"trainer", "engine:0",
                                                                                        "engine:1"}
    assert len({str(sorted(r["checksums"].items())) for r in records}) == 1  # trainer, engine, restarted engine
    assert run_closing(EngineClient(engines[1].url).weight_version()) == 3
    assert state_checksums(trainer.items()) != pusher.snapshot.trainer_checksums  # the trainer really moved on
    synced = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "weights_synced"]
    assert [e.get("resync", False) for e in synced] == [False, True]


def test_without_keep_snapshot_no_bytes_are_kept_and_resync_says_so(engines) -> None:
    pusher = WeightPusher(timeout_s=60)
    try:
        pusher.push(_buckets(build_model("tiny-qwen3", seed=1).state_dict()), [_target(engines[0], "engine:0")], 1,
                    requested="distributed", weights_device=CPU)
        assert pusher.snapshot is None
        with pytest.raises(RuntimeError, match="no weight snapshot"):
            pusher.resync([_target(engines[0], "engine:0")])
    finally:
        pusher.close()


def test_a_hung_engine_fails_the_push_within_its_timeout_instead_of_blocking() -> None:
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3"])
    pusher = WeightPusher(timeout_s=3)
    try:
        os.kill(proc.proc.pid, signal.SIGSTOP)
        with pytest.raises(EngineError, match=proc.url):
            pusher.push(_buckets(build_model("tiny-qwen3", seed=1).state_dict()), [_target(proc, "engine:0")], 1,
                        requested="tensor", weights_device=CPU)
    finally:
        os.kill(proc.proc.pid, signal.SIGCONT)
        pusher.close()
        proc.stop()


def test_a_stock_sglang_engine_is_checked_by_its_own_hashes_and_a_wrong_tensor_shows(tmp_path) -> None:
    """A server that answers /weights_checker as stock SGLang 0.5.14 does (the embedded engine with
    --weights-checker-layout sglang): the trainer hashes what it sent in SGLang's layout, the records match,
    and a tensor the engine holds differently no longer does."""
    from dataclasses import replace

    from harness.checks.weights import _judge

    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--weights-checker-layout", "sglang"])
    artifacts = RunArtifacts(tmp_path)
    pusher = WeightPusher(timeout_s=60)
    try:
        target = replace(_target(proc, "engine:0"), checksums="sglang")
        report = pusher.push(_buckets(build_model("tiny-qwen3", seed=1).state_dict()), [target], 4,
                             requested="auto", weights_device=CPU)
        record_push(artifacts, report, step=0, seconds=0.1)
        run_closing(EngineClient(proc.url).weights_checker("reset_tensors"))
        after_reset = run_closing(EngineClient(proc.url).sglang_checksums())
    finally:
        pusher.close()
        proc.stop()
    trainer, engine = read_jsonl(tmp_path / "weights.jsonl")
    sglang = trainer["layouts"]["sglang"]
    assert engine["layout"] == "sglang" and engine["checksums"] == sglang
    assert "model.layers.0.self_attn.qkv_proj.weight" in sglang and "model.layers.0.mlp.gate_up_proj.weight" in sglang
    assert not any("q_proj" in n or "up_proj.weight" in n and "gate_up" not in n for n in sglang)
    assert _judge(4, "engine:0", trainer, engine) == []
    problems = _judge(4, "engine:0", trainer, {**engine, "checksums": after_reset})
    assert len(problems) == len(sglang) and "qkv_proj" in " ".join(problems)


def test_engines_whose_checksums_cannot_be_matched_are_recorded_unverified_with_why(engines, tmp_path) -> None:
    """No checksums at all, or a tensor-parallel stock SGLang engine: the push lands, and weights.jsonl says
    why that side has none instead of claiming equality."""
    import asyncio
    from dataclasses import replace

    from relax.weights.push import _target_checksums

    artifacts = RunArtifacts(tmp_path)
    pusher = WeightPusher(timeout_s=60)
    try:
        targets = [replace(_target(engines[0], "engine:0"), checksums=None)]
        report = pusher.push(_buckets(build_model("tiny-qwen3", seed=1).state_dict()), targets, 4,
                             requested="tensor", weights_device=CPU)
        tp2 = replace(_target(engines[1], "engine:1"), checksums="sglang", tp_size=2)  # read back without a push
        asyncio.run(_target_checksums([*targets, tp2], 10, report))
        record_push(artifacts, report, step=0, seconds=0.1)
    finally:
        pusher.close()
    records = {r["side"]: r for r in read_jsonl(tmp_path / "weights.jsonl")}
    assert records["engine:0"]["checksums"] is None and "no checksums" in records["engine:0"]["unverified"]
    assert records["engine:1"]["checksums"] is None and "2 tensor-parallel ranks" in records["engine:1"]["unverified"]
    assert "layouts" not in records["trainer"]  # no engine to match them against: not computed


def test_an_engine_killed_between_syncs_fails_the_next_push_as_an_engine_error_and_the_survivor_syncs() -> None:
    """A persistent weight-update group with a dead member: the next push raises EngineError (what fault
    tolerance handles) naming the dead engine, not the collective's RuntimeError nor a timeout of the survivor
    left waiting on the broken broadcast, and a push to the survivor opens a new group."""
    procs = [EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", str(s)]) for s in (1, 2)]
    pusher = WeightPusher(timeout_s=20)
    state = build_model("tiny-qwen3", seed=3).state_dict()
    try:
        targets = [_target(p, f"engine:{i}") for i, p in enumerate(procs)]
        pusher.push(_buckets(state), targets, 1, requested="distributed", weights_device=CPU)
        procs[1].kill()
        with pytest.raises(EngineError, match=procs[1].url):
            pusher.push(_buckets(state), targets, 2, requested="distributed", weights_device=CPU)
        report = pusher.push(_buckets(state), targets[:1], 2, requested="distributed", weights_device=CPU)
        assert report.target_checksums["engine:0"] == state_checksums(state.items())
    finally:
        pusher.close()
        for p in procs:
            p.stop()
