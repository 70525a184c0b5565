"""Loss reduction that makes gradient accumulation exactly invariant to micro-batching.

Each micro-batch returns its share of the global loss: per-sample token means summed and
divided by the number of samples in the whole optimizer step (default), or token sums
divided by the global token count (``--calculate-per-token-loss``). Summing the shares of
all micro-batches gives the full-batch value, whatever the micro-batch size.
"""

from __future__ import annotations

import torch


def sum_of_sample_mean(values: torch.Tensor, mask: torch.Tensor, num_global_samples: int) -> torch.Tensor:
    per_sample = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_sample.sum() / max(num_global_samples, 1)


def per_token(values: torch.Tensor, mask: torch.Tensor, num_global_tokens: int) -> torch.Tensor:
    return (values * mask).sum() / max(num_global_tokens, 1)
