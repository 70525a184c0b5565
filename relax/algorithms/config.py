"""The typed slice of flags the RL math needs, resolved and validated once.

`AlgorithmConfig.from_args` is the only place the algorithms read flags; the functions in
this package take the config, never the flat ``args`` namespace (plug-ins get ``cfg.args``
because their Relax signatures take ``args``).
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any

GRPO_FAMILY = ("grpo", "gspo", "sapo", "cispo", "rloo")


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage_estimator: str = "grpo"
    disable_grpo_std_normalization: bool = False
    disable_rewards_normalization: bool = False
    disable_compute_advantages_and_returns: bool = False
    normalize_advantages: bool = False
    rewards_preprocessed: bool = False  # a --custom-reward-post-process-path already shaped the rewards
    gamma: float = 1.0
    lambd: float = 1.0
    # policy loss
    loss_type: str = "policy_loss"
    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None
    entropy_coef: float = 0.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    calculate_per_token_loss: bool = False
    # KL
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    kl_coef: float = 0.0
    use_unbiased_kl: bool = False
    # off-policy corrections
    use_rollout_logprobs: bool = False
    use_tis: bool = False
    tis_clip: float = 2.0
    tis_clip_low: float = 0.0
    use_opsm: bool = False
    opsm_delta: float = 1e-4
    get_mismatch_metrics: bool = False
    # OPD
    use_opd: bool = False
    opd_kl_coef: float = 1.0
    # critic
    value_clip: float = 0.2
    # plug-ins (dotted paths)
    custom_loss_function_path: str | None = None
    custom_tis_function_path: str | None = None
    custom_pg_loss_reducer_function_path: str | None = None
    args: Any = field(default=None, compare=False, repr=False)

    @classmethod
    def from_args(cls, args: Namespace) -> AlgorithmConfig:
        names = [f for f in cls.__dataclass_fields__ if f not in ("args", "rewards_preprocessed")]
        values = {name: getattr(args, name) for name in names if hasattr(args, name)}
        for flag in ("disable_grpo_std_normalization", "disable_rewards_normalization",
                     "disable_compute_advantages_and_returns", "normalize_advantages"):
            values[flag] = bool(values.get(flag))
        if values.get("eps_clip_high") is None:
            values["eps_clip_high"] = values.get("eps_clip", cls.eps_clip)
        values["rewards_preprocessed"] = bool(getattr(args, "custom_reward_post_process_path", None))
        cfg = cls(**values, args=args)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ValueError(f"--eps-clip-c must be > 1 (dual-clip lower bound), got {self.eps_clip_c}")
        if self.kl_coef and self.kl_loss_coef:
            raise ValueError("--kl-coef and --kl-loss-coef cannot both be non-zero")
        if self.loss_type == "custom_loss" and not self.custom_loss_function_path:
            raise ValueError("--loss-type custom_loss requires --custom-loss-function-path")
        if self.tis_clip_low > self.tis_clip:
            raise ValueError(f"--tis-clip-low {self.tis_clip_low} exceeds --tis-clip {self.tis_clip}")
