"""PPO-clip policy loss (clip-higher, dual clip), entropy bonus and KL loss, per micro-batch.

Per token, with ratio r = exp(log_probs - old_log_probs) and advantage A:
pg = max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high)); with dual clip (c > 1) and A < 0,
pg = min(pg, -A c). Total = pg - entropy_coef * entropy + kl_loss_coef * kl(log_probs, ref).
Every returned metric uses the same reduction as the loss (see reducers.py).
"""

from __future__ import annotations

import torch

from relax.algorithms.config import AlgorithmConfig
from relax.algorithms.kl import kl_estimate
from relax.algorithms.reducers import per_token, sum_of_sample_mean


def ppo_clip(cfg: AlgorithmConfig, log_probs, old_log_probs, advantages) -> tuple[torch.Tensor, torch.Tensor]:
    ratio = torch.exp(log_probs - old_log_probs)
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).float()
    if cfg.eps_clip_c is not None:
        dual = torch.minimum(loss, -advantages * cfg.eps_clip_c)
        loss = torch.where(advantages < 0, dual, loss)
    return loss, clipfrac


def policy_loss(
    cfg: AlgorithmConfig,
    *,
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    ref_log_probs: torch.Tensor | None = None,
    rollout_log_probs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    num_global_samples: int,
    num_global_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    if cfg.calculate_per_token_loss:
        def reduce(x: torch.Tensor) -> torch.Tensor:
            return per_token(x, loss_mask, num_global_tokens)
    else:
        def reduce(x: torch.Tensor) -> torch.Tensor:
            return sum_of_sample_mean(x, loss_mask, num_global_samples)

    pg, clipfrac = ppo_clip(cfg, log_probs, old_log_probs, advantages)
    pg_loss = reduce(pg)
    loss = pg_loss
    metrics = {
        "pg_loss": pg_loss.detach(),
        "pg_clipfrac": reduce(clipfrac).detach(),
        "ppo_kl": reduce((old_log_probs - log_probs).detach()),
    }
    if entropy is not None:
        entropy_mean = reduce(entropy)
        metrics["entropy"] = entropy_mean.detach()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * entropy_mean
    if cfg.use_kl_loss and ref_log_probs is not None:
        kl = reduce(kl_estimate(log_probs, ref_log_probs, cfg.kl_loss_type))
        metrics["kl_loss"] = kl.detach()
        loss = loss + cfg.kl_loss_coef * kl
    metrics["loss"] = loss.detach()
    return loss, metrics
