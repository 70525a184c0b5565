"""Policy losses, registered by estimator, and the per-micro-batch loss the trainer calls.

Per token, with ratio r = exp(log_probs - old_log_probs) and advantage A:
- ppo clip (default): pg = max(-A r, -A clip(r, 1 - eps_clip, 1 + eps_clip_high)); dual clip
  (c > 1): for A < 0, pg = min(pg, -A c).
- gspo: the same clipped objective on the sequence-level ratio s = exp(mean_t log r), applied
  per token with GSPO-token gradients (value s, gradient of each token's log-prob).
- sapo: soft gate instead of a clip: pg = -A * 4/tau * sigmoid(tau (r - 1)), tau = sapo_tau_pos
  for A > 0 and sapo_tau_neg otherwise (gradient equals the PG gradient at r = 1).
- cispo: pg = -sg(clip(r, 1 - eps_clip, 1 + eps_clip_high)) * A * log_probs (clipped IS
  weight, never zeroes a token's gradient).
Then pg *= TIS/ICEPOP weights and the OPSM mask; total = pg - entropy_coef * entropy +
kl_loss_coef * KL(log_probs, ref). Every metric uses the loss's reduction (reducers.py).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relax.algorithms.config import AlgorithmConfig
from relax.algorithms.kl import kl_estimate
from relax.algorithms.opsm import opsm_mask
from relax.algorithms.reducers import per_token, sum_of_sample_mean
from relax.algorithms.tis import TIS_SIGNATURE, icepop, mismatch_metrics, truncated_is
from relax.utils.plugins import load_function

LossFn = Callable[[AlgorithmConfig, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def ppo_clip(cfg: AlgorithmConfig, log_probs, old_log_probs, advantages, mask) -> tuple[torch.Tensor, torch.Tensor]:
    return _clipped(cfg, torch.exp(log_probs - old_log_probs), advantages)


def _clipped(cfg: AlgorithmConfig, ratio, advantages) -> tuple[torch.Tensor, torch.Tensor]:
    unclipped = -advantages * ratio
    clipped = -advantages * ratio.clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    loss = torch.maximum(unclipped, clipped)
    clipfrac = (clipped > unclipped).to(ratio.dtype)
    if cfg.eps_clip_c is not None:
        loss = torch.where(advantages < 0, torch.minimum(loss, -advantages * cfg.eps_clip_c), loss)
    return loss, clipfrac


def gspo(cfg: AlgorithmConfig, log_probs, old_log_probs, advantages, mask):
    n = mask.sum(-1, keepdim=True).clamp(min=1)
    seq_log_ratio = ((log_probs - old_log_probs) * mask).sum(-1, keepdim=True) / n
    token_log_ratio = seq_log_ratio.detach() + log_probs - log_probs.detach()
    return _clipped(cfg, torch.exp(token_log_ratio), advantages)


def sapo(cfg: AlgorithmConfig, log_probs, old_log_probs, advantages, mask):
    ratio = torch.exp(log_probs - old_log_probs)
    tau = torch.where(advantages > 0, torch.full_like(ratio, cfg.sapo_tau_pos), torch.full_like(ratio, cfg.sapo_tau_neg))
    gate = torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau
    return -advantages * gate, torch.zeros_like(ratio)


def cispo(cfg: AlgorithmConfig, log_probs, old_log_probs, advantages, mask):
    ratio = torch.exp(log_probs - old_log_probs).detach()
    weight = ratio.clamp(1.0 - cfg.eps_clip, 1.0 + cfg.eps_clip_high)
    return -weight * advantages * log_probs, (weight != ratio).to(ratio.dtype)


POLICY_LOSSES: dict[str, LossFn] = {"gspo": gspo, "sapo": sapo, "cispo": cispo}


def _reducer(cfg: AlgorithmConfig, mask, num_global_samples: int, num_global_tokens: int):
    if cfg.calculate_per_token_loss:
        return lambda x: per_token(x, mask, num_global_tokens)
    return lambda x: sum_of_sample_mean(x, mask, num_global_samples)


def _pg_reducer(cfg: AlgorithmConfig, default, mask, num_global_samples: int, num_global_tokens: int):
    if not cfg.custom_pg_loss_reducer_function_path:
        return default
    fn = load_function(cfg.custom_pg_loss_reducer_function_path, flag="--custom-pg-loss-reducer-function-path",
                       signature="reducer(values, loss_mask, num_global_samples, num_global_tokens) -> Tensor",
                       min_args=4)
    return lambda x: fn(x, mask, num_global_samples, num_global_tokens)


def _tis_weights(cfg: AlgorithmConfig, old_log_probs, rollout_log_probs, mask):
    if cfg.custom_tis_function_path:
        fn = load_function(cfg.custom_tis_function_path, flag="--custom-tis-function-path", signature=TIS_SIGNATURE,
                           min_args=3)
    elif cfg.use_tis:
        fn = truncated_is
    else:
        return None, {}
    if rollout_log_probs is None:
        raise ValueError("TIS needs rollout log-probs (the engine must return log-probs)")
    return fn(old_log_probs, rollout_log_probs, mask, low=cfg.tis_clip_low, high=cfg.tis_clip)


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
    if cfg.loss_type == "custom_loss":
        fn = load_function(cfg.custom_loss_function_path, flag="--custom-loss-function-path",
                           signature="custom_loss(args, inputs: dict[str, Tensor], num_global_samples, "
                                     "num_global_tokens) -> (loss, metrics)", min_args=4)
        inputs = dict(log_probs=log_probs, old_log_probs=old_log_probs, advantages=advantages, loss_mask=loss_mask,
                      ref_log_probs=ref_log_probs, rollout_log_probs=rollout_log_probs, entropy=entropy)
        return fn(cfg.args, inputs, num_global_samples, num_global_tokens)
    reduce = _reducer(cfg, loss_mask, num_global_samples, num_global_tokens)
    behaviour = rollout_log_probs if cfg.use_rollout_logprobs else old_log_probs
    if behaviour is None:
        raise ValueError("--use-rollout-logprobs needs rollout log-probs")
    pg, clipfrac = POLICY_LOSSES.get(cfg.advantage_estimator, ppo_clip)(cfg, log_probs, behaviour, advantages, loss_mask)
    metrics: dict[str, torch.Tensor] = {}
    share = reduce(torch.ones_like(loss_mask)).detach()  # this micro-batch's share, so metrics sum to global values
    weights, tis_metrics = _tis_weights(cfg, old_log_probs, rollout_log_probs, loss_mask)
    if weights is not None:
        pg = pg * weights
        metrics.update({k: v.detach() * share for k, v in tis_metrics.items()})
    if cfg.use_opsm:
        keep, dropped = opsm_mask(log_probs, behaviour, advantages, loss_mask, cfg.opsm_delta)
        pg = pg * keep
        metrics["opsm_dropfrac"] = dropped * share
    pg_loss = _pg_reducer(cfg, reduce, loss_mask, num_global_samples, num_global_tokens)(pg)
    loss = pg_loss
    metrics.update(pg_loss=pg_loss.detach(), pg_clipfrac=reduce(clipfrac).detach(),
                   ppo_kl=reduce((behaviour - log_probs).detach()))
    if entropy is not None:
        entropy_mean = reduce(entropy)
        metrics["entropy"] = entropy_mean.detach()
        if cfg.entropy_coef:
            loss = loss - cfg.entropy_coef * entropy_mean
    if cfg.use_kl_loss and ref_log_probs is not None:
        kl = kl_estimate(log_probs, ref_log_probs, cfg.kl_loss_type)
        if cfg.use_unbiased_kl:
            kl = kl * torch.exp(log_probs - old_log_probs).detach()
        kl_loss = reduce(kl)
        metrics["kl_loss"] = kl_loss.detach()
        loss = loss + cfg.kl_loss_coef * kl_loss
    if cfg.get_mismatch_metrics and rollout_log_probs is not None:
        metrics.update({k: v * share for k, v in mismatch_metrics(old_log_probs, rollout_log_probs, loss_mask).items()})
    metrics["loss"] = loss.detach()
    return loss, metrics
