"""Routing replay with --train-backend megatron on gloo CPU workers (megatron-core with tests/megatron_workers.py's
shims), EP 1 (one rank) and EP 2 (two ranks, each routing its own micro-batches): the experts megatron's
routers hand the dispatcher are read back in every policy forward (tests/megatron_routing_checks.py).

* ``--use-rollout-routing-replay``: every forward, the old pass and both epochs, routes each token to the
  rollout's experts;
* ``--use-routing-replay``: the update's forwards route as the old pass did after the routers moved, and
  without the flag the same drift routes some rows otherwise (the check can fail);
* the train/rollout log-prob mismatch metrics are there with and without replay.

The layout of a micro-batch among the router's rows (routing_layout.py) is checked without megatron.
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.routing_layout import RouterRows

needs_megatron = pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")
EP = [pytest.param(1, [], id="ep1"), pytest.param(2, ["--expert-model-parallel-size", "2"], id="ep2"),
      pytest.param(2, ["--pipeline-model-parallel-size", "2"], id="pp2")]  # each stage replays its own layer


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    from tests.megatron_helpers import write_tiny_moe

    return write_tiny_moe(tmp_path_factory.mktemp("moe"))


def test_router_rows_are_seq_first_and_sharded_by_sequence() -> None:
    grid = torch.arange(2 * 5).view(2, 5)  # [b, L]: row i position p holds 5 i + p
    whole = RouterRows.of(2, 5, 0, 1)
    assert whole.to_router(grid).tolist() == [0, 5, 1, 6, 2, 7, 3, 8, 4, 9]  # router row p * b + i
    halves = [RouterRows.of(2, 5, r, 2) for r in range(2)]  # padded to 6, three positions per rank
    padded = torch.nn.functional.pad(grid, (0, 1), value=-1)
    assert [h.positions for h in halves] == [slice(0, 3), slice(3, 6)]
    assert halves[1].to_router(padded).tolist() == [3, 8, 4, 9, -1, -1]
    for h in halves:
        assert torch.equal(h.from_router(h.to_router(padded)), padded[:, h.positions])


def _backend(model: str, world: int, extra: list[str]):
    from relax.backends.config import TrainerConfig
    from relax.backends.megatron import checks
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.utils.arguments import parse_args
    from tests.megatron_routing_checks import megatron_flags

    checks._cuda_available = lambda: True  # parse as on the GPU machine; the worker runs megatron on the CPU
    args = parse_args([*megatron_flags(model, world, *extra), "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion",
                       "--no-rope-fusion"])
    return MegatronTrainBackend(TrainerConfig.from_args(args), "cpu")


def _rollout_replay(rank: int, model: str, world: int, extra: list[str]) -> dict:
    from tests.megatron_routing_checks import check_rollout_routing_replayed

    return check_rollout_routing_replayed(_backend(model, world, ["--use-rollout-routing-replay", *extra]))


def _update_replay(rank: int, model: str, world: int, extra: list[str], replayed: bool) -> dict:
    from megatron.core.transformer.moe.router_replay import RouterReplay

    from tests.megatron_routing_checks import check_update_follows_old_pass

    flags = ["--global-batch-size", "4", *extra, *(["--use-routing-replay"] if replayed else [])]
    first = _backend(model, world, flags)
    second = _backend(model, world, flags)  # a second backend in the process: its own routers, not the first's
    assert not RouterReplay.global_router_replay_instances  # the policies' instances are driven by their backends
    if replayed:
        assert {id(r.router_replay) for _, r in first.routing.routers}.isdisjoint(
            id(r.router_replay) for _, r in second.routing.routers)
    return check_update_follows_old_pass(second, replayed=replayed)


@pytest.mark.megatron
@needs_megatron
@pytest.mark.parametrize("world, extra", EP)
def test_rollout_routing_replay_routes_every_policy_forward_to_the_rollouts_experts(moe_dir, world, extra) -> None:
    from tests.megatron_workers import spawn

    metrics = spawn(_rollout_replay, world, moe_dir, world, extra)
    print({k: v for k, v in metrics.items() if "routing" in k or "rollout_logprob" in k})


@pytest.mark.megatron
@needs_megatron
@pytest.mark.parametrize("world, extra", EP)
def test_routing_replay_replays_the_old_pass_in_the_update(moe_dir, world, extra) -> None:
    from tests.megatron_workers import spawn

    replayed = spawn(_update_replay, world, moe_dir, world, extra, True)
    free = spawn(_update_replay, world, moe_dir, world, extra, False)
    assert replayed["differ"] == 0 and free["differ"] > 0
    print(f"update rows routed off the old pass: {replayed['differ']} with replay, {free['differ']} without")


def _full_recompute(rank: int, model: str, world: int, extra: list[str]) -> dict:
    from tests.megatron_routing_checks import check_full_recompute_replays_in_the_backward

    return check_full_recompute_replays_in_the_backward(lambda *flags: _backend(model, world, [*extra, *flags]))


@pytest.mark.megatron
@needs_megatron
@pytest.mark.parametrize("world, extra", EP)
def test_full_recompute_replays_the_routing_in_the_backward(moe_dir, world, extra) -> None:
    from tests.megatron_workers import spawn

    spawn(_full_recompute, world, moe_dir, world, extra)
