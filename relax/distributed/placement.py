"""Ray cluster start-up and actor placement from ``--resource`` / ``--colocate``.

``--resource '{"actor": [replicas, gpus], "rollout": [replicas, gpus]}'`` (seed 000/004): the
actor role is the trainer, the rollout role the engines. With ``--fully-async`` the service
roles ``reference``, ``actor_fwd`` and ``advantages`` (seed 004, `relax.core.services`) get
actors of their own, one replica each, configured by ``--ref-actor-config``. On a CPU-only run
the GPU counts have nothing to bind to and every actor gets one CPU thread (two torch processes
with two threads each on a 2-core machine are ~70x slower, see MACHINES.md).
"""

from __future__ import annotations

import json
import logging
import os
from argparse import Namespace
from dataclasses import asdict, dataclass, field

from relax.utils.flag_types import ConfigError

SUPPORTED_ROLES = ("actor", "rollout")
SERVICE_ROLES = ("reference", "actor_fwd", "advantages")  # fully-async services (relax/core/services.py)


@dataclass(frozen=True)
class RoleResources:
    replicas: int
    gpus_per_replica: float


@dataclass(frozen=True)
class Placement:
    actor: RoleResources
    rollout: RoleResources
    colocate: bool
    use_gpu: bool
    services: dict[str, RoleResources] = field(default_factory=dict)  # the service roles given

    def actor_options(self, role: str) -> dict:
        if not self.use_gpu:
            return {"num_cpus": 0}
        if role in SERVICE_ROLES:  # each service its own GPUs (advantages: none), never shared with colocate
            return {"num_cpus": 0, "num_gpus": self.services[role].gpus_per_replica}
        res = self.actor if role == "actor" else self.rollout
        gpus = res.gpus_per_replica
        if self.colocate:
            gpus = min(gpus, 0.5)  # trainer and engine share each GPU; they take turns
        return {"num_cpus": 0, "num_gpus": gpus}


def parse_resource(args: Namespace, use_gpu: bool) -> Placement:
    roles = _parse_roles(args.resource)
    default = RoleResources(1, 1.0 if use_gpu else 0.0)
    services = {role: res for role, res in roles.items() if role in SERVICE_ROLES}
    placement = Placement(roles.get("actor", default), roles.get("rollout", default), bool(args.colocate), use_gpu,
                          services)
    return placement


def trainer_ranks(args: Namespace) -> int:
    """How many data-parallel trainer ranks ``--resource`` asks for (its actor replicas; 1 by default)."""
    role = _parse_roles(args.resource).get("actor")
    return role.replicas if role else 1


def rollout_role_given(args: Namespace) -> bool:
    """``--resource`` names the rollout role (the run starts engines for it)."""
    return "rollout" in _parse_roles(args.resource)


def service_roles(args: Namespace) -> frozenset[str]:
    """The fully-async service roles ``--resource`` names (empty without any)."""
    return frozenset(role for role in _parse_roles(args.resource) if role in SERVICE_ROLES)


def _parse_roles(raw) -> dict[str, RoleResources]:
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
        if role in SERVICE_ROLES and int(value[0]) != 1:
            raise ConfigError(f"not supported yet: --resource role {role!r} with {int(value[0])} replicas (one each)")
        if role == "advantages" and value[1]:
            raise ConfigError(f"--resource: role 'advantages' computes on CPU; give it 0 GPUs, got {value!r}")
        roles[role] = RoleResources(int(value[0]), float(value[1]))
    return roles


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


def worker_env() -> dict[str, str]:
    """Environment for every Ray worker: one thread, offline, fault hooks passed through."""
    env = {
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    env.update({k: v for k, v in os.environ.items() if k.startswith("RELAX_")})
    return env


def start_ray(use_gpu: bool) -> None:
    """Start a private local Ray cluster for this run (never attaches to a foreign one)."""
    import ray

    if ray.is_initialized():
        return
    for key, value in worker_env().items():
        os.environ.setdefault(key, value)
    kwargs: dict = {
        "num_cpus": max(2, os.cpu_count() or 2),
        "include_dashboard": False,
        "logging_level": logging.WARNING,
        "log_to_driver": True,
        "runtime_env": {"env_vars": worker_env()},
    }
    temp_dir = os.environ.get("RELAX_RAY_TEMP_DIR")
    if temp_dir:
        kwargs["_temp_dir"] = temp_dir
    if not use_gpu:
        kwargs["num_gpus"] = 0
    ray.init(address="local", **kwargs)
