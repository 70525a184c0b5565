"""The typed slice of flags the Ray placement reads: which roles get which GPUs, and how they pack on nodes.

Built once by the driver (relax/core/runtime.py) and by the flag validation (relax/utils/validation.py), and
handed to `relax.distributed.resources.plan_resources`; the field list is every flag the placement depends on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError


@dataclass(frozen=True)
class PlacementConfig(FlagSlice):
    # the roles and their [replicas, gpus] (a JSON string or the parsed dict)
    resource: Any
    # engines share the trainer's GPUs
    colocate: bool
    # a debug mode leaves a role out (no engines / no trainer); external engines reserve nothing
    debug_train_only: bool
    debug_rollout_only: bool
    rollout_external: bool
    # how GPUs group into engines and nodes
    rollout_num_gpus_per_engine: int
    num_gpus_per_node: int
    # extra environment variables of the training processes (the trainer ranks and the fully-async services)
    train_env_vars: dict[str, Any]

    def validate(self) -> None:
        env = self.train_env_vars
        if not isinstance(env, dict) or not all(isinstance(k, str) and k and "=" not in k for k in env) or not all(
                isinstance(v, str | int | float | bool) for v in env.values()):
            raise ConfigError(f"--train-env-vars must be a JSON object of NAME: value (a string or number), got {env!r}")

    def train_env(self) -> dict[str, str]:
        """``--train-env-vars`` as the string environment a Ray ``runtime_env`` takes."""
        return {k: str(v).lower() if isinstance(v, bool) else str(v) for k, v in self.train_env_vars.items()}
