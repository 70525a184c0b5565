"""Train/rollout mismatch corrections: truncated importance sampling (TIS) and ICEPOP.

The engine that sampled a response (rollout log-probs) and the trainer (old log-probs) disagree
slightly, so the samples are off-policy for the trainer. A correction turns the per-token ratio
``pi_old / pi_rollout`` into a detached weight that multiplies the policy-gradient loss.
``--use-tis`` applies one; ``--custom-tis-function-path`` picks which (default
:func:`truncated_is`; ``relax.algorithms.tis.icepop`` is the built-in alternative). Contract::

    tis_function(old_log_probs, rollout_log_probs, loss_mask, *, low: float, high: float)
        -> (weights: Tensor[B, T], metrics: dict[str, Tensor[B, T]])

``low``/``high`` are ``--tis-clip-low``/``--tis-clip``. Metrics are per-token values; the policy
loss reduces them like the loss, so they stay additive over micro-batches.
"""

from __future__ import annotations

import torch

TIS_SIGNATURE = (
    "tis_function(old_log_probs, rollout_log_probs, loss_mask, *, low, high) -> (weights, metrics)"
)


def truncated_is(old_log_probs, rollout_log_probs, loss_mask, *, low: float, high: float):
    """w = clamp(pi_old / pi_rollout, low, high): keeps every token, bounds the weight's variance."""
    ratio = torch.exp(old_log_probs - rollout_log_probs).detach()
    weights = ratio.clamp(low, high)
    clipped = ((ratio < low) | (ratio > high)).to(ratio.dtype)
    return weights, {"tis_weight": weights, "tis_clipfrac": clipped}


def icepop(old_log_probs, rollout_log_probs, loss_mask, *, low: float, high: float):
    """ICEPOP (Ring-1T): tokens whose ratio leaves [low, high] get weight 0 instead of a clamped one.

    A badly mismatched token is more likely an engine/trainer numerics artefact than signal, so it
    is dropped rather than kept at the bound; in-range tokens keep their raw ratio.
    """
    ratio = torch.exp(old_log_probs - rollout_log_probs).detach()
    keep = ((ratio >= low) & (ratio <= high)).to(ratio.dtype)
    return ratio * keep, {"tis_weight": ratio * keep, "tis_clipfrac": 1.0 - keep}


def mismatch_metrics(
    old_log_probs, rollout_log_probs, loss_mask
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """``--get-mismatch-metrics``: (per-token metrics to reduce like the loss, extremes over valid tokens).

    Per token: |log p_old - log p_rollout| and k3 KL(rollout || old) = r - 1 - log r with
    r = p_old / p_rollout. Extremes: the ratio's min and max (absent when no token is valid).
    """
    diff = (old_log_probs - rollout_log_probs).detach()
    per_token = {"mismatch_logprob_abs_diff": diff.abs(), "mismatch_k3_kl": torch.expm1(diff) - diff}
    ratio = torch.exp(diff)[loss_mask > 0]
    extremes = {"mismatch_ratio_max": ratio.max(), "mismatch_ratio_min": ratio.min()} if ratio.numel() else {}
    return per_token, extremes
