"""The placement plan of ``--resource`` (relax/distributed/resources.py), without Ray.

A role's GPUs are replicas x gpus (seed 001's ``[1, 8]`` is 8 GPUs); the trainer runs one rank per GPU,
the engines are GPUs / --rollout-num-gpus-per-engine; GPUs are reserved in groups of at most
--num-gpus-per-node on one node; --colocate puts rank i and engine i on the same GPU. `check_fits` names
in one line what a cluster lacks.
"""

from __future__ import annotations

from argparse import Namespace
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.distributed.config import PlacementConfig
from relax.distributed.resources import COLOCATED_SHARE, check_fits, plan_resources, trainer_ranks
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError


def _args(resource: dict | None = None, *, colocate: bool = False, per_engine: int = 1, per_node: int = 8,
          train_only: bool = False, rollout_only: bool = False) -> PlacementConfig:
    return PlacementConfig(resource=resource, colocate=colocate, rollout_num_gpus_per_engine=per_engine,
                     num_gpus_per_node=per_node, debug_train_only=train_only, debug_rollout_only=rollout_only,
                     rollout_external=False, train_env_vars={})


def test_seed_colocate_layout_trains_on_every_gpu() -> None:
    """Seed 001/004: {"actor": [1, 8], "rollout": [1, 8]} --colocate: 8 ranks and 8 engines, sharing 8 GPUs."""
    plan = plan_resources(_args({"actor": [1, 8], "rollout": [1, 8]}, colocate=True), "cuda")
    assert [g.bundles for g in plan.groups] == [(1,) * 8] and plan.total_gpus == 8
    assert [s.name for s in plan.trainer_ranks] == [f"trainer:{r}" for r in range(8)]
    assert len(plan.engines) == 8
    for rank, engine in zip(plan.trainer_ranks, plan.engines, strict=True):
        assert (rank.group, rank.bundle) == (engine.group, engine.bundle)
        assert rank.share == engine.share == COLOCATED_SHARE and rank.gpus == engine.gpus == 1
    assert len({(s.group, s.bundle) for s in plan.trainer_ranks}) == 8  # one GPU per rank (NCCL needs that)


def test_a_colocated_engine_of_several_gpus_spans_as_many_ranks_bundles() -> None:
    """--colocate with --rollout-num-gpus-per-engine 2 on 8 GPUs in nodes of 4: engine i computes on bundles 2i and
    2i+1 (its actor on the first), within one node's group; every rank keeps its own GPU."""
    plan = plan_resources(_args({"actor": [1, 8], "rollout": [1, 8]}, colocate=True, per_engine=2, per_node=4), "cuda")
    assert [g.bundles for g in plan.groups] == [(1, 1, 1, 1)] * 2
    assert [(e.name, e.gpus, e.group, e.bundle, e.span) for e in plan.engines] == [
        ("engine:0", 2, 0, 0, 2), ("engine:1", 2, 0, 2, 2), ("engine:2", 2, 1, 0, 2), ("engine:3", 2, 1, 2, 2)]
    assert all(e.share == COLOCATED_SHARE for e in plan.engines)
    assert [(r.group, r.bundle, r.span) for r in plan.trainer_ranks[:3]] == [(0, 0, 1), (0, 1, 1), (0, 2, 1)]
    fewer = plan_resources(_args({"actor": [1, 2], "rollout": [1, 4]}, colocate=True, per_engine=4), "cuda")
    assert fewer.total_gpus == 4 and [(e.bundle, e.span) for e in fewer.engines] == [(0, 4)]


def test_groups_follow_num_gpus_per_node() -> None:
    """16 GPUs on nodes of 4: four groups; ranks fill them in order, so ranks 0-3 share a node."""
    plan = plan_resources(_args({"actor": [1, 16], "rollout": [1, 16]}, colocate=True, per_node=4), "cuda")
    assert [g.bundles for g in plan.groups] == [(1, 1, 1, 1)] * 4
    assert [(s.group, s.bundle) for s in plan.trainer_ranks[:6]] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0), (1, 1)]


def test_separate_roles_get_gpus_of_their_own() -> None:
    plan = plan_resources(_args({"actor": [2, 2], "rollout": [1, 6]}, per_engine=2, per_node=4), "cuda")
    assert [(g.role, g.bundles) for g in plan.groups] == [("actor", (1, 1, 1, 1)), ("rollout", (2, 2)),
                                                          ("rollout", (2,))]
    assert len(plan.trainer_ranks) == 4 and all(s.share == 1.0 and s.group == 0 for s in plan.trainer_ranks)
    assert [(e.gpus, e.share, e.group, e.bundle) for e in plan.engines] == [(2, 2.0, 1, 0), (2, 2.0, 1, 1),
                                                                           (2, 2.0, 2, 0)]
    assert plan.total_gpus == 10 and plan.gpu_roles == "actor+rollout"


def test_cpu_roles_run_replicas_without_reservations() -> None:
    plan = plan_resources(_args({"actor": [2, 0], "rollout": [3, 0]}), "cpu")
    assert plan.groups == () and len(plan.trainer_ranks) == 2 and len(plan.engines) == 3
    assert all(s.gpus == 0 and s.group is None for s in (*plan.trainer_ranks, *plan.engines))
    check_fits(plan, [])  # nothing to reserve: any cluster holds it


def test_defaults_depend_on_the_device() -> None:
    on_gpu = plan_resources(_args(), "cuda")
    assert [(g.role, g.bundles) for g in on_gpu.groups] == [("actor", (1,)), ("rollout", (1,))]
    assert plan_resources(_args(colocate=True), "cuda").total_gpus == 1
    assert plan_resources(_args(), "cpu").groups == ()


def test_debug_modes_leave_a_side_out() -> None:
    roles = {"actor": [1, 2], "rollout": [1, 2]}
    train_only = plan_resources(_args(roles, train_only=True), "cuda")
    assert train_only.engines == () and len(train_only.trainer_ranks) == 2 and train_only.total_gpus == 2
    rollout_only = plan_resources(_args(roles, rollout_only=True, colocate=True), "cuda")
    assert rollout_only.trainer_ranks == () and len(rollout_only.engines) == 2
    assert all(e.share == 1.0 for e in rollout_only.engines)  # nothing to share the GPUs with


def test_service_roles() -> None:
    plan = plan_resources(_args({"actor": [1, 4], "rollout": [1, 2], "reference": [1, 1], "actor_fwd": [1, 1],
                                 "advantages": [1, 0]}), "cuda")
    assert [(g.role, g.bundles) for g in plan.groups][-2:] == [("reference", (1,)), ("actor_fwd", (1,))]
    assert plan.total_gpus == 8 and plan.services["advantages"][0].group is None
    assert [(s.name, s.gpus) for s in plan.services["reference"]] == [("reference:0", 1)]
    two = plan_resources(_args({"actor": [1, 2], "rollout": [1, 2], "reference": [2, 1], "actor_fwd": [2, 0],
                                "advantages": [2, 0]}), "cuda")
    assert [(s.name, s.gpus, s.bundle) for s in two.services["reference"]] == [("reference:0", 1, 0),
                                                                              ("reference:1", 1, 1)]
    assert [s.name for s in two.services["actor_fwd"]] == ["actor_fwd:0", "actor_fwd:1"]
    assert two.total_gpus == 6 and all(s.group is None for s in two.services["advantages"])


@pytest.mark.parametrize("args, device, message", [
    (_args({"rollout": [1, 3]}, per_engine=2), "cuda",
     r"^--resource rollout has 3 GPUs \(1 x 3\), not a multiple of --rollout-num-gpus-per-engine 2$"),
    (_args({"rollout": [1, 16]}, per_engine=16), "cuda",
     r"^not supported yet: --rollout-num-gpus-per-engine 16 > --num-gpus-per-node 8"),
    (_args({"actor": [1, 6], "rollout": [1, 6]}, colocate=True, per_engine=3, per_node=4), "cuda",
     r"^--colocate with --rollout-num-gpus-per-engine 3: an engine's GPUs must sit on one node, and "
     r"--num-gpus-per-node 4 is not a multiple of it$"),
    (_args({"actor": [2, 0]}), "cuda", r"^--resource role 'actor' has 0 GPUs on a --device cuda run"),
    (_args({"rollout": [2, 0]}, per_engine=2), "cpu", r"^--rollout-num-gpus-per-engine 2 has no effect with CPU"),
    (_args({"actor": [2, 0.5]}), "cpu", r"^--resource: role 'actor' needs a whole number of GPUs, got \[2, 0.5\]$"),
    (_args({"reference": [1, 2]}), "cuda", r"^not supported yet: --resource role 'reference' with 2 GPUs"),
    (_args(per_node=0), "cuda", r"^--num-gpus-per-node must be >= 1, got 0$"),
])
def test_requests_that_make_no_sense(args: Namespace, device: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        plan_resources(args, device)


def test_trainer_ranks_count_gpus() -> None:
    assert trainer_ranks(_args({"actor": [1, 8]}).resource) == 8
    assert trainer_ranks(_args({"actor": [2, 4]}).resource) == 8
    assert trainer_ranks(_args({"actor": [2, 0]}).resource) == 2
    assert trainer_ranks(_args({"rollout": [1, 2]}).resource) == 1


def test_flags_are_checked_when_parsing(monkeypatch: pytest.MonkeyPatch) -> None:
    from relax.utils import machine_flags

    monkeypatch.setattr(machine_flags, "has_gpu", lambda args: True)  # parse as on a GPU machine
    base = ["--preset", "quickstart", "--device", "cuda"]
    with pytest.raises(ConfigError, match="not a multiple of --rollout-num-gpus-per-engine 2"):
        parse_args([*base, "--resource", '{"rollout": [1, 3]}', "--rollout-num-gpus-per-engine", "2"])
    with pytest.raises(ConfigError, match=r"^not supported yet: --rollout-num-gpus-per-engine 2 with "
                                          r"--rollout-backend embedded"):
        parse_args([*base, "--resource", '{"rollout": [1, 4]}', "--rollout-num-gpus-per-engine", "2"])
    args = parse_args([*base, "--resource", '{"actor": [1, 4], "rollout": [1, 4]}', "--num-gpus-per-node", "2"])
    assert args.num_gpus_per_node == 2


# ---------------------------------------------------------------------- what a cluster lacks
def test_too_few_gpus_in_the_cluster() -> None:
    plan = plan_resources(_args({"actor": [1, 8], "rollout": [1, 8]}), "cuda")
    with pytest.raises(ConfigError, match=r"^--resource asks 16 GPUs for actor\+rollout; the cluster has 8 "
                                          r"\(2 nodes x 4\)$"):
        check_fits(plan, [4.0, 4.0])
    with pytest.raises(ConfigError, match=r"the cluster has 0 \(1 node x 0\)$"):
        check_fits(plan, [0.0])


def test_a_group_larger_than_every_node() -> None:
    plan = plan_resources(_args({"actor": [1, 4], "rollout": [1, 0]}), "cpu")
    with pytest.raises(ConfigError, match=r"^--resource asks 4 GPUs of one node for actor \(groups of up to "
                                          r"--num-gpus-per-node 8\); no node of the cluster \(2 nodes x 2\) has "
                                          r"them left: set --num-gpus-per-node 2$"):
        check_fits(plan, [2.0, 2.0])
    check_fits(plan_resources(_args({"actor": [1, 4], "rollout": [1, 0]}, per_node=2), "cpu"), [2.0, 2.0])


def test_groups_that_fit_alone_but_not_together() -> None:
    plan = plan_resources(_args({"actor": [1, 3], "rollout": [1, 3]}, per_node=4), "cuda")
    with pytest.raises(ConfigError, match=r"3 GPUs of one node for rollout .* \(2 nodes with 4 \+ 2\) has them left$"):
        check_fits(plan, [4.0, 2.0])


@settings(max_examples=150, deadline=None)
@given(actor=st.integers(1, 12), rollout_engines=st.integers(1, 6), per_engine=st.sampled_from([1, 2, 4]),
       per_node=st.sampled_from([1, 2, 4, 8]), colocate=st.booleans())
def test_every_group_fits_a_node_and_every_gpu_is_used(actor: int, rollout_engines: int, per_engine: int,
                                                       per_node: int, colocate: bool) -> None:
    if per_engine > per_node or (colocate and per_engine > 1):
        return
    plan = plan_resources(_args({"actor": [1, actor], "rollout": [1, rollout_engines * per_engine]},
                                colocate=colocate, per_engine=per_engine, per_node=per_node), "cuda")
    assert all(0 < g.gpus <= per_node for g in plan.groups)
    assert len(plan.trainer_ranks) == actor and len(plan.engines) == rollout_engines
    ranks = [(s.group, s.bundle) for s in plan.trainer_ranks]
    engines = [(s.group, s.bundle) for s in plan.engines]
    bundles = {(i, b) for i, g in enumerate(plan.groups) for b in range(len(g.bundles))}
    assert set(ranks) | set(engines) == bundles  # no bundle is reserved for nobody
    assert len(set(ranks)) == len(ranks) and len(set(engines)) == len(engines)  # one GPU (or engine) each
    for s in (*plan.trainer_ranks, *plan.engines):
        assert plan.groups[s.group].bundles[s.bundle] == s.gpus
    if colocate:  # rank i and engine i share GPU i, each holding half of it
        assert ranks[:rollout_engines] == engines[:actor]
        assert plan.total_gpus == max(actor, rollout_engines)
        assert {s.share for s in (*plan.trainer_ranks, *plan.engines)} == {COLOCATED_SHARE}
    else:
        assert not Counter(ranks + engines) - Counter(set(ranks + engines))  # nothing shared
        assert plan.total_gpus == actor + rollout_engines * per_engine
