"""What ``--resource`` asks for, as a plan of GPU groups and actor slots, before any Ray call.

``--resource '{"actor": [replicas, gpus], "rollout": [replicas, gpus], ...}'`` (seed 000). Seeds 001
and 004 read the second element as the role's GPUs ("[1, 8]: replica count and total GPU count; set
replicas to 1"), and our earlier ``[N, g]`` meant N replicas of g GPUs each; both readings agree on

- a role's GPUs = replicas x gpus;
- the trainer (``actor``) runs one rank per GPU, so ``{"actor": [1, 8]}`` trains on 8 ranks; a CPU
  role (gpus 0) runs ``replicas`` ranks;
- the engines (``rollout``) number GPUs / ``--rollout-num-gpus-per-engine`` (``replicas`` on CPU);
- the fully-async service roles (``reference``, ``actor_fwd``, ``advantages``; relax/core/services.py)
  run one actor each, on one GPU or on CPU.

GPUs are reserved in groups that each sit on one node: a role's GPUs are cut into groups of at most
``--num-gpus-per-node`` GPUs (whole engines only), one STRICT_PACK placement group per group
(relax/distributed/placement.py), so a role may span nodes while no engine does. With
``--colocate`` the trainer and the engines share one set of groups: rank i and engine i take halves
of the same GPU; an engine of several GPUs (``--rollout-num-gpus-per-engine``) computes on as many consecutive
bundles, its actor holding a share of the first (relax/distributed/placement.py `gpu_ids` finds the others' GPUs).
Otherwise every role gets GPUs of its own. The plan is pure (tested without Ray); `check_fits` says in one line
what a cluster lacks.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from relax.distributed.config import PlacementConfig
from relax.utils.flag_types import ConfigError

SUPPORTED_ROLES = ("actor", "rollout")
SERVICE_ROLES = ("reference", "actor_fwd", "advantages")  # fully-async services (relax/core/services.py)
COLOCATED_SHARE = 0.5  # a colocated trainer rank and engine each hold half of their GPU; they take turns


@dataclass(frozen=True)
class RoleResources:
    replicas: int
    gpus: int  # per replica; 0: a CPU role

    @property
    def total_gpus(self) -> int:
        return self.replicas * self.gpus

    @property
    def actors(self) -> int:
        """Actors of a one-actor-per-GPU role (the trainer): one per GPU, or ``replicas`` on CPU."""
        return self.total_gpus if self.gpus else self.replicas


@dataclass(frozen=True)
class GpuGroup:
    """GPUs reserved together on one node: one placement group, one bundle per actor that uses them."""

    role: str  # "actor", "rollout", "actor+rollout" (colocated) or a service role
    bundles: tuple[int, ...]  # GPUs per bundle

    @property
    def gpus(self) -> int:
        return sum(self.bundles)


@dataclass(frozen=True)
class SlotSpec:
    """Where one actor goes: a bundle of a `GpuGroup` (``group``/``bundle`` indices), or anywhere (CPU)."""

    name: str  # "trainer:<rank>", "engine:<i>", "<service>:<i>"
    gpus: int  # GPUs it computes on (0: CPU)
    share: float  # the Ray ``num_gpus`` it takes from its bundle (COLOCATED_SHARE when colocated)
    group: int | None = None
    bundle: int | None = None
    span: int = 1  # bundles of its group it computes on, from ``bundle`` (a colocated engine of several GPUs)


@dataclass(frozen=True)
class ResourcePlan:
    groups: tuple[GpuGroup, ...]
    trainer_ranks: tuple[SlotSpec, ...]
    engines: tuple[SlotSpec, ...]
    services: dict[str, tuple[SlotSpec, ...]]  # role -> its replicas' slots ("<role>:<i>")
    gpus_per_node: int

    @property
    def total_gpus(self) -> int:
        return sum(g.gpus for g in self.groups)

    @property
    def gpu_roles(self) -> str:
        """The roles holding GPUs, for messages: ``actor+rollout``."""
        names = dict.fromkeys(part for g in self.groups for part in g.role.split("+"))
        return "+".join(names) or "no role"


def parse_roles(raw) -> dict[str, RoleResources]:
    """``--resource`` (a JSON string or object) -> role -> `RoleResources`; ConfigError naming the bad role."""
    raw = raw or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--resource: invalid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError('--resource must be a JSON object like {"actor": [1, 1], "rollout": [1, 1]}')
    roles: dict[str, RoleResources] = {}
    for role, value in raw.items():
        if role not in SUPPORTED_ROLES + SERVICE_ROLES:
            raise ConfigError(f"--resource: unknown role {role!r}; known: {', '.join(SUPPORTED_ROLES + SERVICE_ROLES)}")
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)):
            raise ConfigError(f"--resource: role {role!r} needs [replicas, gpus], got {value!r}")
        if int(value[0]) < 1 or value[1] < 0:
            raise ConfigError(f"--resource: role {role!r} needs replicas >= 1 and gpus >= 0, got {value!r}")
        if value[1] != int(value[1]):
            raise ConfigError(f"--resource: role {role!r} needs a whole number of GPUs, got {value!r}")
        if role == "advantages" and value[1]:
            raise ConfigError(f"--resource: role 'advantages' computes on CPU; give it 0 GPUs, got {value!r}")
        if role in SERVICE_ROLES and value[1] > 1:
            raise ConfigError(f"not supported yet: --resource role {role!r} with {int(value[1])} GPUs (a service "
                              "runs one unsharded model on one GPU)")
        roles[role] = RoleResources(int(value[0]), int(value[1]))
    return roles


def trainer_ranks(resource: Any) -> int:
    """How many trainer ranks ``--resource`` asks for: one per actor GPU (replicas on CPU); 1 by default."""
    role = parse_roles(resource).get("actor")
    return role.actors if role else 1


def rollout_role_given(resource: Any) -> bool:
    """``--resource`` names the rollout role (the run starts engines for it)."""
    return "rollout" in parse_roles(resource)


def service_roles(resource: Any) -> frozenset[str]:
    """The fully-async service roles ``--resource`` names (empty without any)."""
    return frozenset(role for role in parse_roles(resource) if role in SERVICE_ROLES)


def plan_resources(cfg: PlacementConfig, device: str) -> ResourcePlan:
    """The groups and slots of a run on ``device`` ("cpu" or "cuda"); ConfigError for a request that makes no sense.

    A role left out of ``--resource`` gets one replica of one GPU on CUDA runs (none on CPU). The
    debug modes leave a role out: ``--debug-train-only`` starts no engines, ``--debug-rollout-only``
    no trainer; ``--rollout-external`` reserves nothing for engines (they run elsewhere).
    """
    roles = parse_roles(cfg.resource)
    default = RoleResources(1, 1 if device == "cuda" else 0)
    actor = None if cfg.debug_rollout_only else roles.get("actor", default)
    rollout = None if cfg.debug_train_only or cfg.rollout_external else roles.get("rollout", default)
    per_engine, per_node = cfg.rollout_num_gpus_per_engine, cfg.num_gpus_per_node
    _check_sizes(actor, rollout, device, per_engine, per_node)
    builder = _Builder(per_node)
    ranks: list[SlotSpec] = []
    engines: list[SlotSpec] = []
    if cfg.colocate and actor and rollout and actor.gpus and rollout.gpus:
        if per_node % per_engine:
            raise ConfigError(f"--colocate with --rollout-num-gpus-per-engine {per_engine}: an engine's GPUs must sit "
                              f"on one node, and --num-gpus-per-node {per_node} is not a multiple of it")
        places = builder.add("actor+rollout", max(actor.total_gpus, rollout.total_gpus), 1)
        ranks = [SlotSpec(f"trainer:{r}", 1, COLOCATED_SHARE, *places[r]) for r in range(actor.total_gpus)]
        # engine i computes on GPUs i*per_engine.. of the shared bundles; its actor holds a share of the first
        engines = [SlotSpec(f"engine:{i}", per_engine, COLOCATED_SHARE, *places[i * per_engine], span=per_engine)
                   for i in range(rollout.total_gpus // per_engine)]
    else:
        if actor:
            ranks = _role_slots(builder, "actor", "trainer", actor.actors, actor.gpus and 1)
        if rollout:
            count = rollout.total_gpus // per_engine if rollout.gpus else rollout.replicas
            engines = _role_slots(builder, "rollout", "engine", count, rollout.gpus and per_engine)
    services = {}
    for role, res in roles.items():
        if role in SERVICE_ROLES:
            services[role] = tuple(_role_slots(builder, role, role, res.replicas, res.gpus))
    return ResourcePlan(tuple(builder.groups), tuple(ranks), tuple(engines), services, per_node)


def _check_sizes(actor: RoleResources | None, rollout: RoleResources | None, device: str, per_engine: int,
                 per_node: int) -> None:
    if per_node < 1:
        raise ConfigError(f"--num-gpus-per-node must be >= 1, got {per_node}")
    if per_engine < 1:
        raise ConfigError(f"--rollout-num-gpus-per-engine must be >= 1, got {per_engine}")
    for name, role in (("actor", actor), ("rollout", rollout)):
        if role is not None and device == "cuda" and not role.gpus:
            raise ConfigError(f"--resource role {name!r} has 0 GPUs on a --device cuda run (give it GPUs, or run "
                              "--device cpu)")
    if rollout is None or not rollout.gpus:
        if per_engine != 1 and rollout is not None:
            raise ConfigError(f"--rollout-num-gpus-per-engine {per_engine} has no effect with CPU engines "
                              "(--resource rollout gpus 0)")
        return
    if per_engine > per_node:
        raise ConfigError(f"not supported yet: --rollout-num-gpus-per-engine {per_engine} > --num-gpus-per-node "
                          f"{per_node} (an engine spanning nodes)")
    if rollout.total_gpus % per_engine:
        raise ConfigError(f"--resource rollout has {rollout.total_gpus} GPUs ({rollout.replicas} x {rollout.gpus}), "
                          f"not a multiple of --rollout-num-gpus-per-engine {per_engine}")


def _role_slots(builder: _Builder, role: str, name: str, count: int, gpus_each: int) -> list[SlotSpec]:
    """``count`` actors of ``gpus_each`` GPUs in groups of their own (CPU actors when ``gpus_each`` is 0)."""
    if not gpus_each:
        return [SlotSpec(f"{name}:{i}", 0, 0.0) for i in range(count)]
    places = builder.add(role, count, gpus_each)
    return [SlotSpec(f"{name}:{i}", gpus_each, float(gpus_each), *places[i]) for i in range(count)]


class _Builder:
    """Cuts each role's bundles into groups of at most ``per_node`` GPUs."""

    def __init__(self, per_node: int):
        self.per_node = per_node
        self.groups: list[GpuGroup] = []

    def add(self, role: str, count: int, gpus_each: int) -> list[tuple[int, int]]:
        """Groups for ``count`` bundles of ``gpus_each`` GPUs; (group index, bundle index) of each bundle."""
        per_group = self.per_node // gpus_each
        places = []
        for first in range(0, count, per_group):
            size = min(per_group, count - first)
            places += [(len(self.groups), b) for b in range(size)]
            self.groups.append(GpuGroup(role, (gpus_each,) * size))
        return places


def check_fits(plan: ResourcePlan, node_gpus: list[float]) -> None:
    """ConfigError, in one line, when the cluster (``node_gpus``: GPUs of each alive node) cannot hold the plan.

    Checks the total, then that every group finds a node of its own size (first fit, largest group
    first). A plan without GPUs always fits. GPUs that other jobs hold now are not counted against
    it: they may come free (a global restart reserves right after releasing), so the placement
    waits for them, for a bounded time (relax/distributed/placement.py).
    """
    need = plan.total_gpus
    if not need:
        return
    have = sum(node_gpus)
    cluster = _describe_nodes(node_gpus)
    if need > have:
        raise ConfigError(f"--resource asks {need} GPUs for {plan.gpu_roles}; the cluster has {_num(have)} "
                          f"({cluster})")
    left = sorted(node_gpus, reverse=True)
    for group in sorted(plan.groups, key=lambda g: g.gpus, reverse=True):
        fit = next((i for i, free in enumerate(left) if free >= group.gpus), None)
        if fit is None:
            raise ConfigError(
                f"--resource asks {group.gpus} GPUs of one node for {group.role} (groups of up to "
                f"--num-gpus-per-node {plan.gpus_per_node}); no node of the cluster ({cluster}) has them left"
                + ("" if max(node_gpus) >= plan.gpus_per_node else
                   f": set --num-gpus-per-node {_num(max(node_gpus))}"))
        left[fit] -= group.gpus


def _describe_nodes(node_gpus: list[float]) -> str:
    counts = Counter(_num(g) for g in node_gpus)
    if len(counts) == 1:
        gpus, nodes = next(iter(counts.items()))
        return f"{nodes} node{'s' if nodes != 1 else ''} x {gpus}"
    return f"{len(node_gpus)} nodes with " + " + ".join(_num(g) for g in sorted(node_gpus, reverse=True))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


@dataclass(frozen=True)
class RefActorConfig:
    """``--ref-actor-config``: overrides for the reference and actor_fwd services (seed 004)."""

    tensor_model_parallel_size: int = 1  # only 1: the services run one unsharded model each
    sequence_parallel: bool = False  # only false (needs tensor parallelism)
    max_tokens_per_gpu: int | None = None  # the services' token budget per micro-batch; None: the trainer's batching
    only_load_weight: bool = True  # forward-only: no optimizer or gradient state (false is not supported)


def parse_ref_actor_config(raw) -> dict:
    """Every key of `RefActorConfig` resolved (a dict, so run.json records it); ConfigError naming a bad key."""
    flag = "--ref-actor-config"
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        raise ConfigError(f'{flag} must be a JSON object like {{"tensor_model_parallel_size": 1, '
                          f'"max_tokens_per_gpu": 16384}}, got {raw!r}')
    known = tuple(RefActorConfig.__dataclass_fields__)
    for key, value in raw.items():
        if key not in known:
            raise ConfigError(f"{flag}: unknown key {key!r}; known: {', '.join(known)}")
        want_bool = key in ("sequence_parallel", "only_load_weight")
        ok = isinstance(value, bool) if want_bool else (
            (value is None and key == "max_tokens_per_gpu") or (type(value) is int and value >= 1))
        if not ok:
            want = "true or false" if want_bool else "an integer >= 1" + (" or null" if key == "max_tokens_per_gpu" else "")
            raise ConfigError(f"{flag}: {key} must be {want}, got {value!r}")
    cfg = RefActorConfig(**raw)
    if cfg.tensor_model_parallel_size != 1:
        raise ConfigError(f"not supported yet: {flag} tensor_model_parallel_size={cfg.tensor_model_parallel_size}")
    if cfg.sequence_parallel:
        raise ConfigError(f"not supported yet: {flag} sequence_parallel=true")
    if not cfg.only_load_weight:
        raise ConfigError(f"not supported yet: {flag} only_load_weight=false (the services are forward-only)")
    return asdict(cfg)
