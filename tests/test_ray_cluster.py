"""``relax train`` joins a real two-node Ray cluster and places its actors across the nodes.

The cluster is two ``ray start`` processes on this machine (tests/ray_cluster.py), each declaring two
logical GPUs: relax computes on CPU (``--device cpu``) but reserves GPUs exactly as on a GPU cluster,
so the placement (relax/distributed/placement.py) is the one a GPU run gets. With
``--num-gpus-per-node 2`` the trainer's two ranks fill one node and the two engines the other; the
events name each actor's node, reported by the actor itself. A request for more GPUs than the
cluster has fails at start with one line instead of waiting on a pending placement group.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax.utils.presets import QUICKSTART
from tests.e2e_helpers import assert_ok, read_jsonl
from tests.ray_cluster import ENV, LocalCluster

pytestmark = [pytest.mark.ray, pytest.mark.slow]

# the quickstart task without its preset, whose --colocate would put trainer and engines on the same GPUs
FLAGS = ["--train-backend", "torch", "--device", "cpu", "--hf-checkpoint", "tiny-qwen3",
         "--prompt-data", QUICKSTART["prompt_data"], "--input-key", "prompt", "--label-key", "label",
         "--rm-type", "exact", "--rollout-max-response-len", "1", "--lr", "3e-3",
         "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
         "--micro-batch-size", "16"]


@pytest.fixture(scope="module")
def cluster():
    with LocalCluster(nodes=2, gpus=2) as running:
        yield running


def _relax(cluster: LocalCluster, tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """``relax train`` as its own driver process, told the cluster by RAY_ADDRESS (as ray job submit does)."""
    # none of this process's RAY_* variables: an earlier in-process ray.init leaves RAY_AUTH_MODE=token here,
    # and a driver with token auth on a cluster without it loses its actors ("all references ... removed")
    env = {k: v for k, v in os.environ.items() if k != "RELAX_RAY_TEMP_DIR" and not k.startswith("RAY_")}
    env.update(ENV, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", RAY_ADDRESS=cluster.address)
    proc = subprocess.run([sys.executable, "-m", "relax.cli", "train", *FLAGS, *flags], capture_output=True,
                          text=True, timeout=300, env=env, cwd=tmp_path)
    if proc.returncode not in (0, 2):  # a run that died: keep the nodes' word on it (the logs go with the cluster)
        proc.stderr += "\n--- cluster logs ---\n" + cluster.diagnostics()
    return proc


def test_trainer_and_engines_on_different_nodes(cluster: LocalCluster, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = _relax(cluster, tmp_path, "--resource", '{"actor": [1, 2], "rollout": [1, 2]}', "--num-gpus-per-node", "2",
                  "--num-rollout", "3", "--output-dir", str(run))
    assert_ok(proc)
    events = read_jsonl(run / "events.jsonl")
    nodes = {e["role"]: e["node_id"] for e in events if e["event"] == "process_started"}
    assert sorted(nodes) == ["engine:0", "engine:1", "trainer:0", "trainer:1"]
    trainer_node, engine_node = nodes["trainer:0"], nodes["engine:0"]
    assert nodes["trainer:1"] == trainer_node and nodes["engine:1"] == engine_node
    assert {trainer_node, engine_node} == set(cluster.node_ids)  # one node each, both of the cluster
    gpus = {e["role"]: e["gpu_ids"] for e in events if e["event"] == "process_started"}
    assert sorted(gpus["trainer:0"] + gpus["trainer:1"]) == ["0", "1"]  # one (logical) GPU per rank
    assert sorted(gpus["engine:0"] + gpus["engine:1"]) == ["0", "1"]
    [placement] = [e for e in events if e["event"] == "placement"]
    assert [(g["role"], g["bundles"], g["node_id"]) for g in placement["groups"]] == [
        ("actor", [1, 1], trainer_node), ("rollout", [1, 1], engine_node)]
    records = read_jsonl(run / "weights.jsonl")
    for version in range(4):  # the initial sync and one per step
        sides = {r["side"]: r["checksums"] for r in records if r["version"] == version}
        assert set(sides) == {"trainer", "engine:0", "engine:1"}, version
        assert sides["engine:0"] == sides["trainer"] == sides["engine:1"], version
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [0, 1, 2]
    info = json.loads((run / "run.json").read_text())
    assert info["status"] == "completed" and info["config"]["resource"] == {"actor": [1, 2], "rollout": [1, 2]}
    assert "'data_parallel_size': 2" in proc.stdout + proc.stderr


def test_a_request_the_cluster_cannot_hold_fails_at_once(cluster: LocalCluster, tmp_path: Path) -> None:
    """Without the check the placement group would stay pending forever (the subprocess timeout would fire)."""
    proc = _relax(cluster, tmp_path, "--resource", '{"actor": [1, 4], "rollout": [1, 4]}', "--num-gpus-per-node", "2",
                  "--num-rollout", "1",
                  "--output-dir", str(tmp_path / "run"))
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == "relax: --resource asks 8 GPUs for actor+rollout; the cluster has 4 (2 nodes x 2)", last


def test_joins_a_token_cluster_with_only_its_address(tmp_path: Path) -> None:
    """A head started by ``ray start --head`` with token authentication (Ray's default once ~/.ray/auth_token
    exists); the driver has the token in its HOME and no RAY_AUTH_MODE: the address alone is enough. Without a
    token the run stops at start with one line, not after ray.init's 30 s of retries."""
    import secrets
    import time

    home = tmp_path / "home"
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text(secrets.token_hex(32))
    env = {k: v for k, v in os.environ.items() if k != "RELAX_RAY_TEMP_DIR" and not k.startswith("RAY_")}
    env.update(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S="0")
    with LocalCluster(nodes=1, gpus=0, token_home=home) as cluster:
        train = [sys.executable, "-m", "relax.cli", "train", *FLAGS, "--num-rollout", "1", "--ray-address", cluster.address]
        proc = subprocess.run([*train, "--output-dir", str(tmp_path / "run")], capture_output=True, text=True,
                              timeout=300, env={**env, "HOME": str(home)}, cwd=tmp_path)
        assert_ok(proc)
        start = time.monotonic()
        refused = subprocess.run([*train, "--output-dir", str(tmp_path / "refused")], capture_output=True, text=True,
                                 timeout=120, env={**env, "HOME": str(tmp_path)}, cwd=tmp_path)
        elapsed = time.monotonic() - start
    assert refused.returncode == 2 and elapsed < 25, (refused.returncode, elapsed, refused.stderr[-2000:])
    last = refused.stderr.strip().splitlines()[-1]
    assert last.startswith(f"relax: cannot join the Ray cluster at {cluster.address}") and "no token" in last, last


def test_a_head_port_taken_before_ray_binds_it_is_redrawn(monkeypatch) -> None:
    """The free-port race of tests/ray_cluster.py (seen in CI: GCS "Failed to start the grpc server"): another
    process holds the drawn head port; the start draws new ports and comes up."""
    import socket

    from tests import ray_cluster

    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))  # bound, not listening: Ray cannot bind it, and nothing answers on it
    real = ray_cluster._free_port
    first = iter([taken.getsockname()[1]])
    monkeypatch.setattr(ray_cluster, "_free_port", lambda: next(first, None) or real())
    try:
        cluster = ray_cluster.LocalCluster(nodes=1, gpus=0, cpus=1)
        assert cluster.port == taken.getsockname()[1]
        with cluster:
            assert cluster.port != taken.getsockname()[1] and cluster.node_ids
    finally:
        taken.close()


def test_a_nodes_ports_are_drawn_distinct_and_apart_from_the_heads() -> None:
    """A node's five ports are drawn with their sockets held, so none repeats (drawn one at a time, two of them once
    came back equal and `ray start` refused the node); none is the head's or the dashboard's, and all are free
    again after the draw."""
    import socket

    from tests.ray_cluster import _free_ports

    avoid = set(_free_ports(2))
    for _ in range(20):
        ports = _free_ports(5, avoid=avoid)
        assert len(set(ports)) == 5 and not avoid & set(ports)
        for port in ports:
            with socket.socket() as s:
                s.bind(("127.0.0.1", port))
