"""--distributed-backend (seed 000): the trainer ranks' process-group backend. nccl (the default) is NCCL on CUDA
runs and gloo on CPU runs; gloo is gloo everywhere. Two CPU ranks report the backend their group really runs."""

from __future__ import annotations

import os

import pytest
import ray

from relax.distributed.trainer_group import TrainerGroup, group_backend
from relax.utils.arguments import ConfigError, parse_args
from tests.e2e_helpers import FAST_FLAGS, in_process_ray


def test_the_backend_each_request_gets() -> None:
    assert group_backend("nccl", "cuda") == "nccl"
    assert group_backend("nccl", "cpu") == "gloo"
    assert group_backend("gloo", "cuda") == "gloo" and group_backend("gloo", "cpu") == "gloo"


def test_values_and_the_megatron_refusal() -> None:
    assert parse_args([*FAST_FLAGS, "--distributed-backend", "gloo"]).distributed_backend == "gloo"
    with pytest.raises(ConfigError, match="--distributed-backend"):
        parse_args([*FAST_FLAGS, "--distributed-backend", "mpi"])
    with pytest.raises(ConfigError, match="--distributed-backend gloo: not supported yet with --train-backend megatron"):
        parse_args([*FAST_FLAGS, "--distributed-backend", "gloo", "--train-backend", "megatron", "--device", "cuda"])


@ray.remote(num_cpus=0)
class Probe:
    """Stands in for a trainer rank: joins the group as TrainerActor does and reports its backend."""

    def __init__(self, config, device, member) -> None:
        import torch
        import torch.distributed as dist

        member.join()
        t = torch.ones(1)
        dist.all_reduce(t)  # the group really works
        self.seen = (dist.get_backend(), float(t.item()))

    def pid(self) -> int:
        return os.getpid()

    def attach_peers(self, peers) -> None:
        pass

    def seen_backend(self):
        return self.seen


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    yield from in_process_ray(tmp_path_factory.mktemp("ray"))


@pytest.mark.ray
@pytest.mark.parametrize("requested", ["gloo", "nccl"])
def test_two_cpu_ranks_join_a_gloo_group(ray_cluster, requested: str) -> None:
    group = TrainerGroup.start(Probe, None, "cpu", [{}] * 2, timeout_minutes=2, backend=requested)
    try:
        assert ray.get([a.seen_backend.remote() for a in group.actors]) == [("gloo", 2.0)] * 2
    finally:
        for actor in group.actors:
            ray.kill(actor, no_restart=True)
