"""What the trainer reports about one RL step besides its loss metrics (docs/artifacts.md).

- The train/rollout log-prob mismatch over *every* response token: the mean, the max and the p99
  (nearest rank) of ``|trainer - rollout|``, and ``train/train_rollout_kl`` = mean(rollout - trainer), the sampled-token
  estimate of KL(rollout policy || trainer policy). At step 0 both sides hold the same weights, so
  it measures the engine against the trainer (``train/ppo_kl`` compares the trainer with itself).
  A mean alone hides a decode bug that touches only the later tokens of a response.
- The samples the trainer consumed: ``(group_index, index, passes)`` for every sample whose rows
  went through the loss, where ``passes`` counts those passes (PPO epochs x micro-batches holding
  the row). The driver writes them to samples.jsonl as ``consumed`` records, so sample accounting
  compares the trainer's own view with the rollout's.
"""

from __future__ import annotations

import math

import torch

CONSUMED_KEY = "trainer/consumed_samples"  # in train_rollout's return value; the driver moves it to samples.jsonl


def logprob_mismatch_metrics(trainer_lp: torch.Tensor, rollout_lp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
    """``[N, T]`` log-probs and loss mask -> mean / max / p99 of the absolute gap and the signed mean."""
    keep = mask > 0
    gap = (trainer_lp - rollout_lp)[keep].double()
    if gap.numel() == 0:
        return {}
    absolute = gap.abs()
    return {
        "train/train_rollout_logprob_abs_diff": float(absolute.mean()),
        "train/train_rollout_logprob_abs_diff_max": float(absolute.max()),
        "train/train_rollout_logprob_abs_diff_p99": float(absolute.kthvalue(math.ceil(0.99 * absolute.numel())).values),
        "train/train_rollout_kl": float(-gap.mean()),
    }


def consumed_samples(sample_ids: list[tuple[int, int] | None], passes: torch.Tensor) -> list[list[int]]:
    """``[[group_index, index, passes], ...]`` for rows the loss saw (``passes[row] > 0``) that carry an id."""
    counts = passes.round().to(torch.int64).tolist()
    return [[int(sid[0]), int(sid[1]), int(n)] for sid, n in zip(sample_ids, counts, strict=True)
            if sid is not None and n > 0]
