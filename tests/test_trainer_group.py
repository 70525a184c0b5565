"""The data-parallel trainer group under Ray: `relax train` with two trainer ranks, and a dead rank.

The math (two ranks train what one trainer trains) is tests/test_data_parallel.py; here the group
itself: both ranks start and join one gloo group, rank 0 hands them every step and the resume,
weight syncs stay bitwise equal, and a rank that dies fails the step at once instead of leaving rank 0
in a collective until --distributed-timeout-minutes.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import ray

from relax.backends.config import TrainerConfig
from relax.backends.torch.batch import TrainSample
from relax.distributed.actors import TrainerActor
from relax.distributed.trainer_group import TrainerGroup
from relax.utils.arguments import parse_args
from tests.e2e_helpers import FAST_FLAGS, assert_ok, in_process_ray, read_jsonl, run_relax

DP2 = ["--resource", '{"actor": [2, 0], "rollout": [1, 0]}']


def test_two_trainer_ranks_train_sync_and_resume(tmp_path: Path) -> None:
    """Every process of the run with lazy gloo (TORCH_GLOO_LAZY_INIT=1): the ranks connect at their first
    gradient all-reduce through the driver's store, as NCCL ranks do, so the store must outlive start-up (two
    GPUs once failed at the first step when it did not)."""
    run = tmp_path / "run"
    lazy = {"TORCH_GLOO_LAZY_INIT": "1"}
    assert_ok(run_relax([*FAST_FLAGS, *DP2, "--num-rollout", "2", "--save", str(tmp_path / "ckpt"),
                         "--output-dir", str(run)], tmp_path, env=lazy))
    events = read_jsonl(run / "events.jsonl")
    assert {e["role"] for e in events if e["event"] == "process_started"} == {"trainer:0", "trainer:1", "engine:0"}
    records = read_jsonl(run / "weights.jsonl")
    for version in range(3):
        sides = {r["side"]: r["checksums"] for r in records if r["version"] == version}
        assert sides["trainer"] == sides["engine:0"], version
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1] and all(m["train/num_optimizer_steps"] == 1 for m in metrics)
    resumed = tmp_path / "resumed"
    proc = run_relax([*FAST_FLAGS, *DP2, "--num-rollout", "3", "--load", str(tmp_path / "ckpt"),
                      "--output-dir", str(resumed)], tmp_path)
    assert_ok(proc)
    assert [m["step"] for m in read_jsonl(resumed / "metrics.jsonl")] == [2]
    assert "'data_parallel_size': 2" in proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    yield from in_process_ray(tmp_path_factory.mktemp("ray"))


def test_a_dead_rank_fails_the_step_at_once(ray_cluster) -> None:
    args = parse_args([*FAST_FLAGS, *DP2, "--num-rollout", "1", "--distributed-timeout-minutes", "30"])
    group = TrainerGroup.start(TrainerActor, TrainerConfig.from_args(args), "cpu",
                               [{"num_cpus": 0, "max_concurrency": 2}] * 2,
                               timeout_minutes=args.distributed_timeout_minutes)
    assert len(set(group.pids)) == 2
    samples = [TrainSample(tokens=[5, 6, 7, 8], response_length=2, loss_mask=[1, 1], reward=float(i % 2))
               for i in range(32)]
    assert ray.get(group.leader.train_rollout.remote(samples, 0))["train/num_optimizer_steps"] == 1
    ray.kill(group.actors[1], no_restart=True)
    start = time.perf_counter()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(group.leader.train_rollout.remote(samples, 1), timeout=120)
    assert time.perf_counter() - start < 60  # not the 30-minute collective timeout
    ray.kill(group.leader, no_restart=True)
