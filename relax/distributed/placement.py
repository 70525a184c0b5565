"""Ray cluster start-up and actor placement from ``--resource`` / ``--colocate``.

``--resource '{"actor": [replicas, gpus], "rollout": [replicas, gpus]}'`` (seed 000/004): the
actor role is the trainer, the rollout role the engines. On a CPU-only run the GPU counts
have nothing to bind to and every actor gets one CPU thread (two torch processes with two
threads each on a 2-core machine are ~70x slower, see MACHINES.md).
"""

from __future__ import annotations

import json
import logging
import os
from argparse import Namespace
from dataclasses import dataclass

from relax.utils.arguments import ConfigError

SUPPORTED_ROLES = ("actor", "rollout")
LATER_ROLES = ("reference", "actor_fwd", "advantages")  # fully-async services (issue "Modes")


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

    def actor_options(self, role: str) -> dict:
        res = self.actor if role == "actor" else self.rollout
        if not self.use_gpu:
            return {"num_cpus": 0}
        gpus = res.gpus_per_replica
        if self.colocate:
            gpus = min(gpus, 0.5)  # trainer and engine share each GPU; they take turns
        return {"num_cpus": 0, "num_gpus": gpus}


def parse_resource(args: Namespace, use_gpu: bool) -> Placement:
    raw = args.resource or {}
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--resource: invalid JSON: {exc}") from None
    if not isinstance(raw, dict):
        raise ConfigError('--resource must be a JSON object like {"actor": [1, 1], "rollout": [1, 1]}')
    roles: dict[str, RoleResources] = {}
    for role, value in raw.items():
        if role in LATER_ROLES:
            raise ConfigError(f"not supported yet: --resource role {role!r}")
        if role not in SUPPORTED_ROLES:
            raise ConfigError(f"--resource: unknown role {role!r}; known: {', '.join(SUPPORTED_ROLES + LATER_ROLES)}")
        if not (isinstance(value, list) and len(value) == 2 and all(isinstance(v, int | float) for v in value)):
            raise ConfigError(f"--resource: role {role!r} needs [replicas, gpus], got {value!r}")
        if int(value[0]) < 1 or value[1] < 0:
            raise ConfigError(f"--resource: role {role!r} needs replicas >= 1 and gpus >= 0, got {value!r}")
        roles[role] = RoleResources(int(value[0]), float(value[1]))
    default = RoleResources(1, 1.0 if use_gpu else 0.0)
    placement = Placement(roles.get("actor", default), roles.get("rollout", default), bool(args.colocate), use_gpu)
    if placement.actor.replicas > 1:
        raise ConfigError("not supported yet: --resource actor replicas > 1 (data-parallel training)")
    return placement


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
