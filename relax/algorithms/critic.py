"""Critic (value) loss and the actor/critic schedule for PPO.

Value loss with ``--value-clip`` c (PPO2 style, as in slime/OpenRLHF):
``0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`` per token, reduced like the policy
loss so micro-batch shares add up. The critic's learning rate is ``--critic-lr`` (resolved to
``--lr`` when unset), warmed up linearly over ``--critic-lr-warmup-iters`` steps. The actor is
frozen while the critic catches up (the first ``--num-critic-only-steps`` steps) and for the whole
run with ``--critic-train-only``: an untrained critic makes GAE advantages noise.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from relax.algorithms.reducers import default_reducer

if TYPE_CHECKING:
    from relax.algorithms.config import AlgorithmConfig


def value_loss(
    cfg: AlgorithmConfig,
    *,
    values,
    old_values,
    returns,
    loss_mask,
    num_global_samples: int,
    num_global_tokens: int,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    reduce = default_reducer(cfg.calculate_per_token_loss, loss_mask, num_global_samples, num_global_tokens)
    clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
    unclipped_err, clipped_err = (values - returns) ** 2, (clipped - returns) ** 2
    loss = reduce(0.5 * torch.maximum(unclipped_err, clipped_err))
    clipfrac = reduce((clipped_err > unclipped_err).to(values.dtype))
    return loss, {"value_loss": loss.detach(), "value_clipfrac": clipfrac.detach()}


def critic_lr_at(step: int, cfg: AlgorithmConfig) -> float:
    """Critic learning rate at 0-based ``step``: (step + 1) / warmup of --critic-lr, then flat."""
    if cfg.critic_lr_warmup_iters <= 0:
        return cfg.critic_lr
    return cfg.critic_lr * min(1.0, (step + 1) / cfg.critic_lr_warmup_iters)


def should_update_actor(cfg: AlgorithmConfig, step: int) -> bool:
    """False while only the critic trains: 0-based ``step`` < --num-critic-only-steps, or --critic-train-only."""
    return not cfg.critic_train_only and step >= cfg.num_critic_only_steps
