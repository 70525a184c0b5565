"""Advantage estimators, registered by ``--advantage-estimator`` name.

Rewards are one scalar per sample, groups contiguous (``group_size`` samples per prompt).
Every estimator returns per-token advantages ``[B, T]`` that are zero where the mask is 0.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from relax.algorithms.config import AlgorithmConfig


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


def group_normalize(rewards: torch.Tensor, group_size: int, *, std: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: subtract the group mean, and (unless Dr.GRPO) divide by the group std (unbiased=False)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size).double()
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if std:
        centered = centered / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)
    return centered.view(-1).to(rewards.dtype)


def _grpo(cfg: AlgorithmConfig, rewards: torch.Tensor, loss_mask: torch.Tensor, group_size: int, **_: object):
    if cfg.disable_rewards_normalization:
        scores = rewards
    else:
        scores = group_normalize(rewards, group_size, std=not cfg.disable_grpo_std_normalization)
    return AdvantageOutput(scores.unsqueeze(-1) * loss_mask)


ESTIMATORS: dict[str, Callable[..., AdvantageOutput]] = {"grpo": _grpo}


def whiten(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    n = mask.sum().clamp(min=1.0)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + eps) * mask


def compute_advantages(
    cfg: AlgorithmConfig,
    *,
    rewards: torch.Tensor,
    loss_mask: torch.Tensor,
    group_size: int,
    old_log_probs: torch.Tensor | None = None,
    ref_log_probs: torch.Tensor | None = None,
    values: torch.Tensor | None = None,
    teacher_log_probs: torch.Tensor | None = None,
) -> AdvantageOutput:
    try:
        estimator = ESTIMATORS[cfg.advantage_estimator]
    except KeyError:
        raise ValueError(f"unknown --advantage-estimator {cfg.advantage_estimator!r}; known: {', '.join(ESTIMATORS)}") from None
    out = estimator(cfg, rewards=rewards, loss_mask=loss_mask, group_size=group_size, old_log_probs=old_log_probs,
                    ref_log_probs=ref_log_probs, values=values, teacher_log_probs=teacher_log_probs)
    if cfg.normalize_advantages:
        out.advantages = whiten(out.advantages, loss_mask)
    return out
