"""Example plug-ins loaded by dotted path in the contract tests of relax.algorithms."""

from __future__ import annotations

import torch


def sequence_sum_reducer(values, loss_mask, num_global_samples, num_global_tokens):
    """--custom-pg-loss-reducer-function-path: token sums per sample, averaged over the global samples."""
    return (values * loss_mask).sum() / num_global_samples


def reinforce_loss(args, batch, reducer):
    """--custom-loss-function-path: plain REINFORCE, -A * log p, with the default reduction."""
    loss = reducer(-batch["advantages"] * batch["log_probs"])
    return loss, {"loss": loss.detach(), "custom_seen_tokens": reducer(torch.ones_like(batch["loss_mask"]))}


def tis_one_arg(old_log_probs):
    """A TIS function with the wrong signature."""
    return old_log_probs


def float_loss(args, batch, reducer):
    """--custom-loss-function-path returning a float and no metrics: refused by name."""
    return 1.0


def raising_loss(args, batch, reducer):
    raise KeyError("log_prob")  # a misspelled batch key


def tis_weights_only(old_log_probs, rollout_log_probs, loss_mask, *, low, high):
    """--custom-tis-function-path returning the weights alone, without metrics."""
    return old_log_probs.exp()


def int_reducer(values, loss_mask, num_global_samples, num_global_tokens):
    return 3
