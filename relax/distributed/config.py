"""The typed slice of flags the Ray placement reads: which roles get which GPUs, and how they pack on nodes.

Built once by the driver (relax/core/runtime.py) and by the flag validation (relax/utils/validation.py), and
handed to `relax.distributed.resources.plan_resources`; the field list is every flag the placement depends on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relax.utils.flag_slice import FlagSlice


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
