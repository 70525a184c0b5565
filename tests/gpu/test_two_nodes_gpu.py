"""Two Ray nodes on one two-GPU host: the trainer on one node's GPU, the engine on the other's.

Each node is its own ``ray start`` (tests/ray_cluster.py) that sees one GPU (``CUDA_VISIBLE_DEVICES``) and has
its own temp dir; ``relax train`` joins the head by ``RAY_ADDRESS``, as ``ray job submit`` tells a driver.
With ``--num-gpus-per-node 1`` the trainer's and the engines' placement groups each take a whole node, so
every weight sync crosses from one raylet's worker to the other's by NCCL. Checked from the artifacts: the
two actors on different nodes, one GPU each, every sync by the ``distributed`` transport and bitwise equal
at every version.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relax.utils.presets import QUICKSTART
from tests.e2e_helpers import assert_ok, read_jsonl
from tests.ray_cluster import ENV, RAY, LocalCluster

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu, pytest.mark.ray,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]

FLAGS = ["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
         "--prompt-data", QUICKSTART["prompt_data"], "--input-key", "prompt", "--label-key", "label",
         "--custom-rm-path", "harness.rewards.digit_share", "--rollout-max-response-len", "24", "--lr", "3e-3",
         "--rollout-batch-size", "8", "--n-samples-per-prompt", "4", "--global-batch-size", "32",
         "--micro-batch-size", "16", "--num-rollout", "4", "--num-gpus-per-node", "1",
         "--resource", '{"actor": [1, 1], "rollout": [1, 1]}']
ROOT = str(Path(__file__).resolve().parents[2])


def _driver_env(cluster: LocalCluster) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "RELAX_RAY_TEMP_DIR" and not k.startswith("RAY_")}
    env.update(ENV, HF_HUB_OFFLINE="1", RAY_ADDRESS=cluster.address)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, env.get("PYTHONPATH", "")])  # harness.rewards on every node
    return env


def test_trainer_and_engine_on_two_nodes_sync_by_nccl(tmp_path: Path) -> None:
    run = tmp_path / "run"
    with LocalCluster(nodes=2, gpus=1, cpus=4, visible=["0", "1"]) as cluster:
        proc = subprocess.run([sys.executable, "-m", "relax.cli", "train", *FLAGS, "--output-dir", str(run)],
                              capture_output=True, text=True, timeout=420, env=_driver_env(cluster), cwd=tmp_path)
        if proc.returncode != 0:
            proc.stderr += "\n--- cluster logs ---\n" + cluster.diagnostics()
        assert_ok(proc)
        nodes = set(cluster.node_ids)
    _check_split_across_nodes(run, nodes)


def _dashboard_missing() -> str | None:
    """Why Ray's dashboard (which serves ``ray job submit``) cannot start here: ray[default]'s packages, absent
    from a minimal install (ci/gpu_session.sh's two_nodes item installs them from .whl5)."""
    from ray._private.utils import get_dashboard_dependency_error

    error = get_dashboard_dependency_error()
    return f"ray job submit needs Ray's dashboard packages (ray[default]): {error}" if error else None


@pytest.mark.skipif(_dashboard_missing() is not None, reason=str(_dashboard_missing()))
def test_the_same_run_submitted_as_a_ray_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 001's Ray Job mode: ``ray job submit`` runs scripts/entrypoint/ray-job.sh on the head node, which
    joins the cluster named by the RAY_ADDRESS the job server gives it."""
    run = tmp_path / "run"
    # the nodes' (and so the job's) python3 and PYTHONPATH: this interpreter and the repo
    monkeypatch.setenv("PATH", os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with LocalCluster(nodes=2, gpus=1, cpus=4, visible=["0", "1"], dashboard=True) as cluster:
        script = Path(ROOT) / "scripts" / "entrypoint" / "ray-job.sh"
        submit = [*RAY, "job", "submit", "--address", cluster.dashboard_url, "--",
                  "bash", str(script), *FLAGS, "--output-dir", str(run)]  # ray quotes each word
        proc = subprocess.run(submit, capture_output=True, text=True, timeout=480, env=_driver_env(cluster),
                              cwd=tmp_path)
        if proc.returncode != 0 or "succeeded" not in proc.stdout + proc.stderr:
            proc.stderr += "\n--- cluster logs ---\n" + cluster.diagnostics()
        assert_ok(proc)
        assert "succeeded" in proc.stdout + proc.stderr, proc.stdout[-3000:]
        nodes = set(cluster.node_ids)
    _check_split_across_nodes(run, nodes)


def _check_split_across_nodes(run: Path, nodes: set[str]) -> None:
    events = read_jsonl(run / "events.jsonl")
    started = {e["role"]: e for e in events if e["event"] == "process_started"}
    assert sorted(started) == ["engine:0", "trainer:0"]
    assert {started["trainer:0"]["node_id"], started["engine:0"]["node_id"]} == nodes  # one node each
    # each node's only GPU (Ray names it by the node's CUDA_VISIBLE_DEVICES): two physical GPUs, one each
    assert sorted(started["trainer:0"]["gpu_ids"] + started["engine:0"]["gpu_ids"]) == ["0", "1"]
    synced = [e for e in events if e["event"] == "weights_synced"]
    assert len(synced) == 5 and all(e["transports"] == ["distributed"] for e in synced)
    records = read_jsonl(run / "weights.jsonl")
    for version in range(5):
        sides = {r["side"]: r["checksums"] for r in records if r["version"] == version}
        assert sides["trainer"] == sides["engine:0"], version
