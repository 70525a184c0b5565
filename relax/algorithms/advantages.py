"""Advantage estimators, registered by ``--advantage-estimator`` name.

Rewards are one scalar per sample, groups contiguous (``group_size`` samples per prompt).
Every estimator returns per-token advantages ``[B, T]`` that are zero where the mask is 0.
``--kl-coef`` shapes rewards with the KL between the rollout policy (old log-probs) and the
reference, estimated per token with ``--kl-loss-type`` (see docs/algorithms.md):
GRPO family and REINFORCE++-baseline subtract ``kl_coef * sum_t kl_t`` from each sample's
scalar reward; REINFORCE++ and PPO subtract ``kl_coef * kl_t`` from every token's reward.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from relax.algorithms.config import AlgorithmConfig
from relax.algorithms.kl import kl_estimate


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass
class AdvantageInputs:
    rewards: torch.Tensor  # [B]
    loss_mask: torch.Tensor  # [B, T]
    group_size: int
    old_log_probs: torch.Tensor | None
    ref_log_probs: torch.Tensor | None
    values: torch.Tensor | None
    teacher_log_probs: torch.Tensor | None


def group_normalize(rewards: torch.Tensor, group_size: int, *, std: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: subtract the group mean, and (unless Dr.GRPO) divide by the group std (unbiased=False)."""
    if rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    grouped = rewards.view(-1, group_size).double()
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if std:
        centered = centered / (grouped.std(dim=1, unbiased=False, keepdim=True) + eps)
    return centered.view(-1).to(rewards.dtype)


def whiten(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit variance over the valid tokens of the whole batch."""
    n = mask.sum().clamp(min=1.0)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + eps) * mask


def token_kl(cfg: AlgorithmConfig, x: AdvantageInputs) -> torch.Tensor:
    if not cfg.kl_coef:
        return torch.zeros_like(x.loss_mask)
    if x.old_log_probs is None or x.ref_log_probs is None:
        raise ValueError("--kl-coef needs old and reference log-probs")
    return kl_estimate(x.old_log_probs, x.ref_log_probs, cfg.kl_loss_type) * x.loss_mask


def _shaped_scalar_rewards(cfg: AlgorithmConfig, x: AdvantageInputs) -> torch.Tensor:
    return x.rewards - cfg.kl_coef * token_kl(cfg, x).sum(-1)


def _group_scores(cfg: AlgorithmConfig, x: AdvantageInputs) -> torch.Tensor:
    rewards = _shaped_scalar_rewards(cfg, x)
    if cfg.disable_rewards_normalization or cfg.rewards_preprocessed:
        return rewards
    return group_normalize(rewards, x.group_size, std=not cfg.disable_grpo_std_normalization)


def _grpo(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """GRPO / Dr.GRPO; GSPO, SAPO and CISPO share these advantages and differ in the loss."""
    return AdvantageOutput(_group_scores(cfg, x).unsqueeze(-1) * x.loss_mask)


def _rloo(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """Leave-one-out baseline: r_i - mean_{j != i} r_j within the group."""
    if x.group_size < 2:
        raise ValueError("rloo needs --n-samples-per-prompt >= 2")
    r = _shaped_scalar_rewards(cfg, x).view(-1, x.group_size).double()
    baseline = (r.sum(1, keepdim=True) - r) / (x.group_size - 1)
    return AdvantageOutput((r - baseline).view(-1).to(x.rewards.dtype).unsqueeze(-1) * x.loss_mask)


def _last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Place each sample's scalar reward on its last valid response token."""
    out = torch.zeros_like(mask)
    lengths = mask.sum(-1).long()
    rows = torch.nonzero(lengths > 0).flatten()
    last = (torch.cumsum(mask, -1) == lengths.unsqueeze(-1).to(mask.dtype)) & (mask > 0)
    for i in rows.tolist():
        out[i, int(torch.nonzero(last[i]).max())] = rewards[i]
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    for t in reversed(range(token_rewards.shape[1])):
        running = token_rewards[:, t] + gamma * running * mask[:, t]
        returns[:, t] = running * mask[:, t]
    return returns


def _reinforce_pp(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++: per-token reward = -kl_coef*kl_t (+ reward at the last token), discounted, whitened."""
    token_rewards = _last_token_rewards(x.rewards, x.loss_mask) - cfg.kl_coef * token_kl(cfg, x)
    returns = discounted_returns(token_rewards, x.loss_mask, cfg.gamma)
    return AdvantageOutput(whiten(returns, x.loss_mask), returns=returns)


def _reinforce_pp_baseline(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++-baseline: group-mean baseline on the (KL-shaped) reward, then batch whitening."""
    r = _shaped_scalar_rewards(cfg, x).view(-1, x.group_size)
    centered = (r - r.mean(1, keepdim=True)).view(-1)
    return AdvantageOutput(whiten(centered.unsqueeze(-1) * x.loss_mask, x.loss_mask))


def gae(token_rewards: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, gamma: float, lambd: float):
    """Generalized advantage estimation over response tokens; V after the last token is 0."""
    advantages = torch.zeros_like(token_rewards)
    last = torch.zeros(token_rewards.shape[0], dtype=token_rewards.dtype)
    next_value = torch.zeros_like(last)
    for t in reversed(range(token_rewards.shape[1])):
        m = mask[:, t]
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        last = (delta + gamma * lambd * last) * m
        advantages[:, t] = last
        next_value = torch.where(m > 0, values[:, t], next_value)
        last = torch.where(m > 0, last, torch.zeros_like(last))
    return advantages, (advantages + values) * mask


def _ppo(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    if x.values is None:
        raise ValueError("the ppo estimator needs critic values")
    token_rewards = _last_token_rewards(x.rewards, x.loss_mask) - cfg.kl_coef * token_kl(cfg, x)
    advantages, returns = gae(token_rewards, x.values * x.loss_mask, x.loss_mask, cfg.gamma, cfg.lambd)
    return AdvantageOutput(advantages, returns=returns)


def opd_signal(x: AdvantageInputs) -> torch.Tensor:
    if x.teacher_log_probs is None or x.old_log_probs is None:
        raise ValueError("on-policy distillation needs teacher and old log-probs")
    return (x.teacher_log_probs - x.old_log_probs) * x.loss_mask


def _opd(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """Pure distillation: per-token advantage = opd_kl_coef * (log p_teacher - log p_old)."""
    return AdvantageOutput(cfg.opd_kl_coef * opd_signal(x))


ESTIMATORS: dict[str, Callable[[AlgorithmConfig, AdvantageInputs], AdvantageOutput]] = {
    "grpo": _grpo, "gspo": _grpo, "sapo": _grpo, "cispo": _grpo, "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_pp, "reinforce_plus_plus_baseline": _reinforce_pp_baseline,
    "ppo": _ppo, "on_policy_distillation": _opd,
}


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
    x = AdvantageInputs(rewards, loss_mask, group_size, old_log_probs, ref_log_probs, values, teacher_log_probs)
    if cfg.disable_compute_advantages_and_returns:
        return AdvantageOutput(torch.zeros_like(loss_mask))
    try:
        estimator = ESTIMATORS[cfg.advantage_estimator]
    except KeyError:
        raise ValueError(f"unknown --advantage-estimator {cfg.advantage_estimator!r}; known: {', '.join(ESTIMATORS)}") from None
    out = estimator(cfg, x)
    if cfg.use_opd and cfg.advantage_estimator != "on_policy_distillation":
        out.advantages = out.advantages + cfg.opd_kl_coef * opd_signal(x)
    if cfg.normalize_advantages:
        out.advantages = whiten(out.advantages, loss_mask)
    if cfg.kl_coef:
        out.metrics["kl_reward_penalty"] = float(token_kl(cfg, x).sum() / loss_mask.sum().clamp(min=1))
    return out
