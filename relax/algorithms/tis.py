"""Train/rollout mismatch corrections: truncated importance sampling (TIS) and ICEPOP.

Both compare the trainer's old log-probs with the engine's rollout log-probs of the same
tokens. A correction returns per-token weights (detached) that multiply the policy-gradient
loss, plus metrics. Custom corrections (``--custom-tis-function-path``) follow the same
signature::

    tis_function(old_log_probs, rollout_log_probs, loss_mask, *, low: float, high: float)
        -> tuple[Tensor [B, T] weights, dict[str, Tensor] metrics]
"""

from __future__ import annotations

import torch

TIS_SIGNATURE = "tis_function(old_log_probs, rollout_log_probs, loss_mask, *, low, high) -> (weights, metrics)"


def truncated_is(old_log_probs, rollout_log_probs, loss_mask, *, low: float, high: float):
    """w = clamp(pi_old / pi_rollout, low, high): keeps the gradient, bounds its variance."""
    ratio = torch.exp(old_log_probs - rollout_log_probs).detach()
    weights = ratio.clamp(low, high) * loss_mask
    clipped = ((ratio < low) | (ratio > high)).to(loss_mask.dtype) * loss_mask
    return weights, {"tis_clipfrac": clipped.sum() / loss_mask.sum().clamp(min=1)}


def icepop(old_log_probs, rollout_log_probs, loss_mask, *, low: float, high: float):
    """ICEPOP: tokens whose ratio leaves [low, high] are masked out (weight 0) instead of clamped."""
    ratio = torch.exp(old_log_probs - rollout_log_probs).detach()
    keep = ((ratio >= low) & (ratio <= high)).to(loss_mask.dtype) * loss_mask
    return ratio * keep, {"icepop_maskfrac": 1 - keep.sum() / loss_mask.sum().clamp(min=1)}


def mismatch_metrics(old_log_probs, rollout_log_probs, loss_mask) -> dict[str, torch.Tensor]:
    """Token-mean |old - rollout|, k3 KL(rollout || old), and the ratio's range over valid tokens."""
    n = loss_mask.sum().clamp(min=1)
    diff = (old_log_probs - rollout_log_probs).detach()
    k3 = torch.expm1(diff) - diff
    valid = loss_mask > 0
    ratio = torch.exp(diff)[valid]
    return {
        "mismatch_logprob_abs_diff": (diff.abs() * loss_mask).sum() / n,
        "mismatch_k3_kl": (k3 * loss_mask).sum() / n,
        "mismatch_ratio_max": ratio.max() if ratio.numel() else torch.tensor(1.0),
        "mismatch_ratio_min": ratio.min() if ratio.numel() else torch.tensor(1.0),
    }
