"""The typed slice of flags the reward step reads (`relax.engine.rewards.compute_rewards`).

Built once by the driver (or at a seed hook's boundary) with ``RewardConfig.from_args(args)``
(relax/utils/flag_slice.py); defaults live in the flag schema. It carries ``args`` because every
reward function keeps the seeds' signature ``reward_func(args, sample, **kwargs)`` (seed 001, seed 004).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax.engine.rewards.genrm_config import GenRMConfig
from relax.utils.flag_slice import FlagSlice, sub_slice


@dataclass(frozen=True)
class RewardConfig(FlagSlice):
    # which reward function: a built-in grader or a user function by dotted path
    rm_type: str | None
    custom_rm_path: str | None
    group_rm: bool
    # --rm-type remote_rm's service
    rm_url: str | None
    # each user call's bound, and the key trained on when a reward is a dict
    hook_timeout: float
    reward_key: str | None
    # --genrm-model-path: a judge model's engines score every sample (relax/engine/rewards/genrm.py)
    genrm: GenRMConfig = sub_slice(GenRMConfig)
    args: Any = field(default=None, compare=False, repr=False)

    @property
    def source(self) -> str:
        """The flag and value that name the run's reward function (for messages)."""
        if self.genrm.enabled:
            return f"--genrm-model-path {self.genrm.genrm_model_path}"
        return f"--custom-rm-path {self.custom_rm_path}" if self.custom_rm_path else f"--rm-type {self.rm_type}"
