"""Advantage estimators, registered by ``--advantage-estimator`` name.

Rewards are one scalar per sample with groups contiguous (``group_size`` samples per prompt);
every estimator returns per-token advantages ``[B, T]`` that are zero where the mask is 0.

``--kl-coef`` is KL reward shaping with the per-token penalty ``kl_t = log p_old - log p_ref``
(k1: the rollout policy against the reference), applied before the estimator's baseline:
scalar-reward estimators (grpo, gspo, sapo, cispo, rloo, reinforce_plus_plus_baseline) subtract
``kl_coef * sum_t kl_t`` from each sample's reward before the group baseline; token-level
estimators (reinforce_plus_plus, ppo, on_policy_distillation) subtract ``kl_coef * kl_t`` from
every token's reward (for OPD: from the per-token distillation advantage).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from relax.algorithms.kl import kl_estimate

if TYPE_CHECKING:
    from relax.algorithms.config import AlgorithmConfig


@dataclass
class AdvantageOutput:
    advantages: torch.Tensor
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class AdvantageInputs:
    rewards: torch.Tensor  # [B]
    loss_mask: torch.Tensor  # [B, T]
    group_size: int
    old_log_probs: torch.Tensor | None
    ref_log_probs: torch.Tensor | None
    values: torch.Tensor | None
    teacher_log_probs: torch.Tensor | None


def _groups(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    if group_size < 1 or rewards.numel() % group_size:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of {group_size}")
    return rewards.double().view(-1, group_size)


def group_normalize(rewards: torch.Tensor, group_size: int, *, std: bool, eps: float = 1e-6) -> torch.Tensor:
    """GRPO: (r - group mean) / (group std + eps), std with Bessel's correction as in slime.

    A group whose rewards are all equal gets exact zeros (slime yields rounding noise / eps there).
    """
    grouped = _groups(rewards, group_size)
    centered = grouped - grouped.mean(dim=1, keepdim=True)
    if std:
        var = centered.square().sum(dim=1, keepdim=True) / max(group_size - 1, 1)
        centered = centered / (var.sqrt() + eps)
    flat = (grouped == grouped[:, :1]).all(dim=1, keepdim=True)
    return torch.where(flat, torch.zeros_like(centered), centered).view(-1).to(rewards.dtype)


def whiten(advantages: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """Zero mean, unit (biased) variance over the valid tokens of the whole batch."""
    n = mask.sum().clamp(min=1.0)
    mean = (advantages * mask).sum() / n
    var = (((advantages - mean) * mask) ** 2).sum() / n
    return (advantages - mean) * torch.rsqrt(var + eps) * mask


def token_kl_penalty(cfg: AlgorithmConfig, x: AdvantageInputs) -> torch.Tensor:
    """kl_coef * k1(old, ref) per valid token; zeros when --kl-coef is 0."""
    if not cfg.kl_coef:
        return torch.zeros_like(x.loss_mask)
    if x.old_log_probs is None or x.ref_log_probs is None:
        raise ValueError("--kl-coef needs old and reference log-probs (load a reference model)")
    return cfg.kl_coef * kl_estimate(x.old_log_probs, x.ref_log_probs, "k1") * x.loss_mask


def _shaped_rewards(cfg: AlgorithmConfig, x: AdvantageInputs) -> torch.Tensor:
    return x.rewards - token_kl_penalty(cfg, x).sum(-1)


def _normalizing(cfg: AlgorithmConfig) -> bool:
    return not (cfg.disable_rewards_normalization or cfg.rewards_preprocessed)


def _broadcast(scores: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return scores.to(mask.dtype).unsqueeze(-1) * mask


def _grpo(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """GRPO / Dr.GRPO; gspo, sapo and cispo share these advantages and differ in the loss."""
    rewards = _shaped_rewards(cfg, x)
    if _normalizing(cfg):
        rewards = group_normalize(rewards, x.group_size, std=not cfg.disable_grpo_std_normalization)
    return AdvantageOutput(_broadcast(rewards, x.loss_mask))


def _rloo(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """Leave-one-out baseline: r_i - mean_{j != i} r_j within the group."""
    if x.group_size < 2:
        raise ValueError("rloo needs --n-samples-per-prompt >= 2")
    r = _groups(_shaped_rewards(cfg, x), x.group_size)
    baseline = (r.sum(1, keepdim=True) - r) / (x.group_size - 1)
    return AdvantageOutput(_broadcast((r - baseline).view(-1), x.loss_mask))


def _reinforce_pp_baseline(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++-baseline: group-mean baseline on the (KL-shaped) reward, then batch whitening."""
    r = _shaped_rewards(cfg, x)
    if _normalizing(cfg):
        r = group_normalize(r, x.group_size, std=False)
    return AdvantageOutput(whiten(_broadcast(r, x.loss_mask), x.loss_mask))


def last_token_rewards(rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each sample's scalar reward placed on its last valid token (nothing for an empty row)."""
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    last = torch.where(mask > 0, positions, -1).max(dim=1).values
    out = torch.zeros_like(mask)
    rows = torch.nonzero(last >= 0).flatten()
    out[rows, last[rows]] = rewards[rows].to(mask.dtype)
    return out


def discounted_returns(token_rewards: torch.Tensor, mask: torch.Tensor, gamma: float) -> torch.Tensor:
    """G_t = r_t + gamma * G_{t'} over valid tokens only (masked tokens are skipped, not zeroed steps)."""
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    for t in reversed(range(token_rewards.shape[1])):
        valid = mask[:, t] > 0
        running = torch.where(valid, token_rewards[:, t] + gamma * running, running)
        returns[:, t] = running * mask[:, t]
    return returns


def gae(token_rewards, values, mask, gamma: float, lambd: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalized advantage estimation over the valid tokens of each row; V after the last is 0.

    Masked tokens (padding, tool output inside a multi-turn response) are skipped: the recursion
    links each valid token to the next valid one. Returns (advantages, returns = advantages + V).
    """
    advantages = torch.zeros_like(token_rewards)
    running = torch.zeros_like(token_rewards[:, 0])
    next_value = torch.zeros_like(running)
    for t in reversed(range(token_rewards.shape[1])):
        valid = mask[:, t] > 0
        delta = token_rewards[:, t] + gamma * next_value - values[:, t]
        running = torch.where(valid, delta + gamma * lambd * running, running)
        next_value = torch.where(valid, values[:, t], next_value)
        advantages[:, t] = running * mask[:, t]
    return advantages, (advantages + values) * mask


def _reinforce_pp(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """REINFORCE++: token reward = -kl_coef*kl_t (+ reward on the last token), discounted, whitened."""
    token_rewards = last_token_rewards(x.rewards, x.loss_mask) - token_kl_penalty(cfg, x)
    returns = discounted_returns(token_rewards, x.loss_mask, cfg.gamma)
    return AdvantageOutput(whiten(returns, x.loss_mask), returns=returns)


def _ppo(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """PPO: GAE(gamma, lambd) on critic values with the same token rewards as REINFORCE++."""
    if x.values is None:
        raise ValueError("the ppo estimator needs critic values")
    token_rewards = last_token_rewards(x.rewards, x.loss_mask) - token_kl_penalty(cfg, x)
    advantages, returns = gae(token_rewards, x.values * x.loss_mask, x.loss_mask, cfg.gamma, cfg.lambd)
    return AdvantageOutput(advantages, returns=returns)


def opd_signal(x: AdvantageInputs) -> torch.Tensor:
    """log p_teacher - log p_old per valid token: the reverse-KL reward of on-policy distillation."""
    if x.teacher_log_probs is None or x.old_log_probs is None:
        raise ValueError("on-policy distillation needs teacher and old log-probs")
    return (x.teacher_log_probs - x.old_log_probs) * x.loss_mask


def _opd(cfg: AlgorithmConfig, x: AdvantageInputs) -> AdvantageOutput:
    """Pure distillation: advantage = opd_kl_coef * (log p_teacher - log p_old); rewards unused."""
    return AdvantageOutput(cfg.opd_kl_coef * opd_signal(x) - token_kl_penalty(cfg, x))


Estimator = Callable[["AlgorithmConfig", AdvantageInputs], AdvantageOutput]
ESTIMATORS: dict[str, Estimator] = {
    "grpo": _grpo,
    "gspo": _grpo,
    "sapo": _grpo,
    "cispo": _grpo,
    "rloo": _rloo,
    "reinforce_plus_plus": _reinforce_pp,
    "reinforce_plus_plus_baseline": _reinforce_pp_baseline,
    "ppo": _ppo,
    "on_policy_distillation": _opd,
}


def estimator(name: str) -> Estimator:
    """The registered estimator ``name``; an unknown one raises naming the known ones."""
    try:
        return ESTIMATORS[name]
    except KeyError:
        raise ValueError(f"unknown --advantage-estimator {name!r}; known: {', '.join(ESTIMATORS)}") from None


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
    """Advantages (and returns for ppo / reinforce_plus_plus) for one rollout batch.

    Order: KL reward shaping -> estimator -> OPD term (``--use-opd`` or the
    on_policy_distillation estimator) -> ``--normalize-advantages`` whitening.
    """
    if cfg.disable_compute_advantages_and_returns:
        return AdvantageOutput(torch.zeros_like(loss_mask))
    x = AdvantageInputs(
        rewards, loss_mask, group_size, old_log_probs, ref_log_probs, values, teacher_log_probs
    )
    out = estimator(cfg.advantage_estimator)(cfg, x)
    if cfg.use_opd and cfg.advantage_estimator != "on_policy_distillation":
        out.advantages = out.advantages + cfg.opd_kl_coef * opd_signal(x)
    if cfg.normalize_advantages:
        out.advantages = whiten(out.advantages, loss_mask)
    tokens = float(loss_mask.sum().clamp(min=1))
    if cfg.kl_coef:
        out.metrics["kl_reward_penalty"] = float(token_kl_penalty(cfg, x).sum()) / tokens
    out.metrics["advantages_mean"] = float((out.advantages * loss_mask).sum()) / tokens
    return out
