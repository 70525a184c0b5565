"""Critic (value) loss and schedules for PPO.

Value loss with ``--value-clip`` (PPO2 style): 0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2),
reduced like the policy loss. The critic's learning rate warms up linearly over
``--critic-lr-warmup-iters`` steps; the actor is frozen for the first ``--num-critic-only-steps``
steps and for the whole run with ``--critic-train-only``.
"""

from __future__ import annotations

import torch

from relax.algorithms.reducers import per_token, sum_of_sample_mean


def value_loss(cfg, *, values, old_values, returns, loss_mask, num_global_samples: int, num_global_tokens: int):
    clipped = old_values + (values - old_values).clamp(-cfg.value_clip, cfg.value_clip)
    losses = 0.5 * torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    clipfrac = ((values - returns) ** 2 < (clipped - returns) ** 2).to(values.dtype)
    if cfg.calculate_per_token_loss:
        def reduce(x):
            return per_token(x, loss_mask, num_global_tokens)
    else:
        def reduce(x):
            return sum_of_sample_mean(x, loss_mask, num_global_samples)
    loss = reduce(losses)
    return loss, {"value_loss": loss.detach(), "value_clipfrac": reduce(clipfrac).detach()}


def critic_lr_at(step: int, critic_lr: float, warmup_iters: int) -> float:
    if warmup_iters <= 0:
        return critic_lr
    return critic_lr * min(1.0, (step + 1) / warmup_iters)


def should_update_actor(step: int, *, num_critic_only_steps: int, critic_train_only: bool) -> bool:
    return not critic_train_only and step >= num_critic_only_steps
