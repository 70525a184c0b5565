"""The typed slice of flags the RL math needs, read and validated once.

`AlgorithmConfig.from_args` (relax/utils/flag_slice.py) is the only place the algorithms read flags. Every default lives
in the flag schema (relax/utils/flag_table.py) and derived values (``--eps-clip-high``,
``--critic-lr``) are resolved by relax/utils/validation.py, so this class has no defaults of
its own and reads every field strictly. Plug-ins get ``cfg.args`` because their Relax
signatures take ``args``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class AlgorithmConfig(FlagSlice):
    # advantages
    advantage_estimator: str
    disable_grpo_std_normalization: bool
    disable_rewards_normalization: bool
    disable_compute_advantages_and_returns: bool
    normalize_advantages: bool
    custom_reward_post_process_path: str | None
    custom_convert_samples_to_train_data_path: str | None
    gamma: float
    lambd: float
    # policy loss
    loss_type: str
    custom_loss_function_path: str | None
    eps_clip: float
    eps_clip_high: float
    eps_clip_c: float | None
    entropy_coef: float
    sapo_tau_pos: float
    sapo_tau_neg: float
    calculate_per_token_loss: bool
    custom_pg_loss_reducer_function_path: str | None
    # KL
    use_kl_loss: bool
    kl_loss_coef: float
    kl_loss_type: str
    kl_coef: float
    use_unbiased_kl: bool
    # off-policy corrections
    use_rollout_logprobs: bool
    use_tis: bool
    tis_clip: float
    tis_clip_low: float
    custom_tis_function_path: str | None
    use_opsm: bool
    opsm_delta: float
    get_mismatch_metrics: bool
    # on-policy distillation
    use_opd: bool
    opd_kl_coef: float
    # critic
    value_clip: float
    critic_lr: float
    critic_lr_warmup_iters: int
    num_critic_only_steps: int
    critic_train_only: bool
    args: Any = field(default=None, compare=False, repr=False)

    @property
    def rewards_preprocessed(self) -> bool:
        """A ``--custom-reward-post-process-path`` or a custom train-data converter already turned raw
        rewards into final ones."""
        return self.custom_reward_post_process_path is not None or self.custom_convert_samples_to_train_data_path is not None

    def validate(self) -> None:
        from relax.algorithms.kl import KL_ESTIMATORS

        # --advantage-estimator: the flag's choices at parse time; the estimator registry's lookup for a config
        # built directly (relax.algorithms.advantages.estimator names the known ones)
        if self.kl_loss_type not in KL_ESTIMATORS:
            raise ValueError(
                f"unknown --kl-loss-type {self.kl_loss_type!r}; known: {', '.join(KL_ESTIMATORS)}"
            )
        if self.eps_clip_high is None:
            raise ValueError(
                "--eps-clip-high must be resolved (relax.utils.validation) before building AlgorithmConfig"
            )
        if self.eps_clip_c is not None and self.eps_clip_c <= 1.0:
            raise ValueError(f"--eps-clip-c must be > 1 (dual-clip lower bound), got {self.eps_clip_c}")
        if self.kl_coef and self.use_kl_loss and self.kl_loss_coef:
            raise ValueError(
                "--kl-coef (reward shaping) and --use-kl-loss --kl-loss-coef (loss) are mutually exclusive"
            )
        if self.loss_type not in ("policy_loss", "custom_loss"):
            raise ValueError(f"unknown --loss-type {self.loss_type!r}; known: policy_loss, custom_loss")
        if self.loss_type == "custom_loss" and not self.custom_loss_function_path:
            raise ValueError("--loss-type custom_loss requires --custom-loss-function-path")
        if self.tis_clip_low > self.tis_clip:
            raise ValueError(f"--tis-clip-low {self.tis_clip_low} exceeds --tis-clip {self.tis_clip}")
        if self.custom_tis_function_path and not self.use_tis:
            raise ValueError("--custom-tis-function-path has no effect without --use-tis")
        if self.sapo_tau_pos <= 0 or self.sapo_tau_neg <= 0:
            raise ValueError(
                f"--sapo-tau-pos/--sapo-tau-neg must be > 0, got {self.sapo_tau_pos}/{self.sapo_tau_neg}"
            )
        if not (0.0 <= self.gamma <= 1.0 and 0.0 <= self.lambd <= 1.0):
            raise ValueError(f"--gamma and --lambd must lie in [0, 1], got {self.gamma}/{self.lambd}")
