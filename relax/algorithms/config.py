"""The typed slice of flags the RL math needs, resolved and validated once."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass


@dataclass(frozen=True)
class AlgorithmConfig:
    advantage_estimator: str = "grpo"
    disable_grpo_std_normalization: bool = False
    disable_rewards_normalization: bool = False
    normalize_advantages: bool = False
    eps_clip: float = 0.2
    eps_clip_high: float = 0.2
    eps_clip_c: float | None = None
    entropy_coef: float = 0.0
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "k1"
    calculate_per_token_loss: bool = False

    @classmethod
    def from_args(cls, args: Namespace) -> AlgorithmConfig:
        cfg = cls(
            advantage_estimator=args.advantage_estimator,
            disable_grpo_std_normalization=bool(args.disable_grpo_std_normalization),
            disable_rewards_normalization=bool(args.disable_rewards_normalization),
            normalize_advantages=bool(args.normalize_advantages),
            eps_clip=args.eps_clip,
            eps_clip_high=args.eps_clip if args.eps_clip_high is None else args.eps_clip_high,
            eps_clip_c=args.eps_clip_c,
            entropy_coef=args.entropy_coef,
            use_kl_loss=bool(args.use_kl_loss),
            kl_loss_coef=args.kl_loss_coef,
            kl_loss_type=args.kl_loss_type,
            calculate_per_token_loss=bool(args.calculate_per_token_loss),
        )
        if cfg.eps_clip_c is not None and cfg.eps_clip_c <= 1.0:
            raise ValueError(f"--eps-clip-c must be > 1 (dual-clip lower bound), got {cfg.eps_clip_c}")
        return cfg
