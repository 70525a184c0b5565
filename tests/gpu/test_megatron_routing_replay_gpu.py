"""Routing replay with --train-backend megatron on one GPU (EP 1, small-qwen3-moe, bf16, the default fusions):
the experts megatron-core's routers hand the dispatcher are read back in every policy forward
(tests/megatron_routing_checks.py, the same checks the gloo CPU tests run at EP 1 and 2).

* ``--use-rollout-routing-replay``: the old pass and both epochs of updates route each token to the rollout's
  experts;
* ``--use-routing-replay``: the update's forwards route as the old pass did after the routers moved; without
  the flag the same drift routes some rows otherwise;
* the train/rollout log-prob mismatch metrics are there with and without replay.

Skipped with a reason without CUDA or megatron-core (the CPU twin: tests/test_megatron_routing_replay_cpu.py).
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]


def _backend(*extra: str):
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.utils.arguments import parse_args
    from tests.megatron_routing_checks import megatron_flags

    args = parse_args(megatron_flags("small-qwen3-moe", 1, *extra))
    return MegatronTrainBackend(TrainerConfig.from_args(args), "cuda")


def test_rollout_routing_replay_routes_every_policy_forward_to_the_rollouts_experts(mcore) -> None:
    from tests.megatron_routing_checks import check_rollout_routing_replayed

    check_rollout_routing_replayed(_backend("--use-rollout-routing-replay"))


def test_routing_replay_replays_the_old_pass_in_the_update(mcore) -> None:
    from tests.megatron_routing_checks import check_update_follows_old_pass

    replayed = check_update_follows_old_pass(_backend("--global-batch-size", "4", "--use-routing-replay"),
                                             replayed=True)
    free = check_update_follows_old_pass(_backend("--global-batch-size", "4"), replayed=False)
    assert replayed["differ"] == 0 and free["differ"] > 0


def test_full_recompute_replays_the_routing_in_the_backward(mcore) -> None:
    from tests.megatron_routing_checks import check_full_recompute_replays_in_the_backward

    check_full_recompute_replays_in_the_backward(_backend)
