"""Loss reduction that makes gradient accumulation exactly invariant to micro-batching.

Each micro-batch returns its share of the global loss: per-sample token means summed and
divided by the number of samples in the whole optimizer step (default, slime's
``sum_of_sample_mean``), or token sums divided by the global token count
(``--calculate-per-token-loss``). Summing the shares of all micro-batches gives the full-batch
value whatever the micro-batch size, and an empty mask row contributes 0 instead of NaN.

``--custom-pg-loss-reducer-function-path`` replaces the reduction of pg_loss only; it must
keep the same additivity for micro-batch invariance::

    reducer(values: Tensor[B, T], loss_mask: Tensor[B, T], num_global_samples: int,
            num_global_tokens: int) -> Tensor (scalar)
"""

from __future__ import annotations

from collections.abc import Callable

import torch

Reducer = Callable[[torch.Tensor], torch.Tensor]
REDUCER_SIGNATURE = "reducer(values, loss_mask, num_global_samples, num_global_tokens) -> Tensor"


def sum_of_sample_mean(values: torch.Tensor, mask: torch.Tensor, num_global_samples: int) -> torch.Tensor:
    per_sample = (values * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_sample.sum() / max(num_global_samples, 1)


def per_token(values: torch.Tensor, mask: torch.Tensor, num_global_tokens: int) -> torch.Tensor:
    return (values * mask).sum() / max(num_global_tokens, 1)


def default_reducer(
    per_token_loss: bool, mask: torch.Tensor, num_global_samples: int, num_global_tokens: int
) -> Reducer:
    if per_token_loss:
        return lambda x: per_token(x, mask, num_global_tokens)
    return lambda x: sum_of_sample_mean(x, mask, num_global_samples)


def merge_metrics(total: dict[str, torch.Tensor], part: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Accumulate one micro-batch's metrics: summed, except ``*_max``/``*_min`` (extremes)."""
    out = dict(total)
    for key, value in part.items():
        if key not in out:
            out[key] = value
        elif key.endswith("_max"):
            out[key] = torch.maximum(out[key], value)
        elif key.endswith("_min"):
            out[key] = torch.minimum(out[key], value)
        else:
            out[key] = out[key] + value
    return out
