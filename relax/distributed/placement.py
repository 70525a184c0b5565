"""Actor placement on the Ray cluster: the plan's GPU groups reserved as placement groups, one slot per actor.

`Placement.reserve` turns a `ResourcePlan` (relax/distributed/resources.py) into Ray reservations:
each `GpuGroup` becomes a STRICT_PACK placement group (all its bundles on one node), and each slot
carries the Ray options that put its actor into its bundle. The runtime only reads the slots:
``placement.trainer_ranks``, ``placement.engines`` and ``placement.services``, each with ``options``
for ``ActorClass.options(**slot.options)``, the GPUs the actor computes on and the node it lands on.

A request the cluster cannot hold fails before anything is reserved, in one line naming what is
missing (`check_fits`); a reservation that still does not come through (other jobs took the GPUs
meanwhile) fails after ``RESERVE_TIMEOUT_S`` instead of leaving the run pending forever. CPU slots
(roles with 0 GPUs) have no bundle: Ray places them on any node, with one CPU thread each
(two torch processes with two threads each on a 2-core machine are ~70x slower, see MACHINES.md).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from relax.distributed.cluster import free_gpus, node_gpus, worker_env
from relax.distributed.resources import ResourcePlan, SlotSpec, check_fits
from relax.utils.flag_types import ConfigError

RESERVE_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Slot:
    """One actor's place: Ray options (placement group and bundle, GPU share, worker env), GPUs, node."""

    name: str  # "trainer:<rank>", "engine:<i>", "<service>:<i>"
    gpus: int  # GPUs the actor computes on (0: CPU)
    options: dict = field(hash=False)
    node_id: str | None  # the node of its bundle; None for a CPU slot (Ray picks the node)
    # every bundle it computes on, as Ray scheduling strategies, when that is more than its own (a colocated engine
    # of several GPUs): `gpu_ids` asks each for its GPU
    span: tuple = field(default=(), hash=False)


@dataclass
class Placement:
    plan: ResourcePlan
    trainer_ranks: list[Slot]
    engines: list[Slot]
    services: dict[str, list[Slot]]  # role -> its replicas
    groups: list = field(default_factory=list)  # the Ray placement groups, one per plan group
    group_nodes: list[str] = field(default_factory=list)  # the node each group landed on

    @classmethod
    def reserve(cls, plan: ResourcePlan, timeout_s: float = RESERVE_TIMEOUT_S,
                train_env: dict[str, str] | None = None) -> Placement:
        """Reserve the plan's groups (Ray must be up); ConfigError naming what the cluster lacks. ``train_env``
        (``--train-env-vars``) is added to the worker environment of the training processes: the trainer
        ranks and the fully-async services."""
        import ray
        from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

        nodes = node_gpus()
        check_fits(plan, list(nodes.values()))
        free = free_gpus()
        groups = [placement_group([{"GPU": float(gpus)} for gpus in g.bundles], strategy="STRICT_PACK",
                                  name=f"relax-{g.role}-{i}") for i, g in enumerate(plan.groups)]
        ready, _ = ray.wait([g.ready() for g in groups], num_returns=len(groups), timeout=timeout_s) if groups else ([], [])
        if len(ready) < len(groups):
            for group in groups:
                remove_placement_group(group)
            raise ConfigError(f"--resource: the cluster did not grant {plan.total_gpus} GPUs for {plan.gpu_roles} "
                              f"within {timeout_s:.0f} s: {free:g} of its {sum(nodes.values()):g} GPUs were free when "
                              "it asked (other jobs or placement groups hold the rest)")
        group_nodes = [placement_group_table(g)["bundles_to_node_id"][0] for g in groups]
        base = worker_env()
        training = {"env_vars": {**base, **(train_env or {})}}

        def slot(spec: SlotSpec, env: dict | None = None) -> Slot:
            env = env or {"env_vars": base}
            if spec.group is None:
                return Slot(spec.name, 0, {"num_cpus": 0, "runtime_env": env}, None)
            from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

            def strategy(bundle: int) -> PlacementGroupSchedulingStrategy:
                return PlacementGroupSchedulingStrategy(groups[spec.group], placement_group_bundle_index=bundle)

            options = {"num_cpus": 0, "num_gpus": spec.share, "scheduling_strategy": strategy(spec.bundle),
                       "runtime_env": env}
            span = tuple(strategy(spec.bundle + b) for b in range(spec.span)) if spec.span > 1 else ()
            return Slot(spec.name, spec.gpus, options, group_nodes[spec.group], span)

        return cls(plan, [slot(s, training) for s in plan.trainer_ranks], [slot(s) for s in plan.engines],
                   {role: [slot(s, training) for s in specs] for role, specs in plan.services.items()}, groups,
                   group_nodes)

    def describe(self) -> list[dict]:
        """The reserved groups for events.jsonl: role, GPUs per bundle, node."""
        return [{"role": g.role, "bundles": list(g.bundles), "node_id": node}
                for g, node in zip(self.plan.groups, self.group_nodes, strict=True)]

    def release(self) -> None:
        """Give the GPUs back (a restarted run reserves them again)."""
        from ray.util.placement_group import remove_placement_group

        for group in self.groups:
            try:
                remove_placement_group(group)
            except Exception:  # noqa: BLE001 - already gone with the job
                pass
        self.groups = []


PROBE_SHARE = 0.01  # the GPU share a probe takes from a bundle (a colocated bundle has half of its GPU free)


def gpu_ids(slot: Slot, timeout_s: float = RESERVE_TIMEOUT_S) -> list[str]:
    """The node's GPU ids of the bundles ``slot`` computes on, in order (a colocated engine of several GPUs: Ray
    gives its actor the first bundle's GPU only, and its server process takes them all). Each id comes from a
    probe task in that bundle; asked before the slot's actor takes its share. ConfigError when a probe is not
    placed within ``timeout_s``."""
    import ray

    probe = ray.remote(_assigned_gpu)
    refs = [probe.options(num_cpus=0, num_gpus=PROBE_SHARE, scheduling_strategy=s).remote() for s in slot.span]
    ready, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
    if len(ready) < len(refs):
        for ref in refs:
            ray.cancel(ref, force=True)
        raise ConfigError(f"{slot.name}: the GPUs of its {len(refs)} bundles were not reported within {timeout_s:.0f} s "
                          "(another actor holds the whole of one of them)")
    return ray.get(refs)


def _assigned_gpu() -> str:
    import ray

    ids = ray.get_runtime_context().get_accelerator_ids().get("GPU", [])
    return str(ids[0])


def where(actor) -> dict:
    """``{"pid", "node_id", "gpu_ids"}`` of a running actor, asked from inside it (for process_started events);
    ``gpu_ids``: the node's GPU ids it computes on: its ``compute_gpus`` when it has them (a colocated engine of
    several GPUs, whose server is given more than Ray gave the actor), else what Ray gave it (its
    CUDA_VISIBLE_DEVICES), empty for a CPU slot."""
    import ray

    return ray.get(actor.__ray_call__.remote(_whereabouts))


def _whereabouts(actor) -> dict:
    import ray

    context = ray.get_runtime_context()
    gpus = getattr(actor, "compute_gpus", None) or context.get_accelerator_ids().get("GPU", [])
    return {"pid": os.getpid(), "node_id": context.get_node_id(), "gpu_ids": [str(i) for i in gpus]}
