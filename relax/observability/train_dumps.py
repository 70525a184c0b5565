"""``--save-debug-train-data PATH`` and ``--dump-details DIR``: each step's training data, on disk, from rank 0
of the trainer once its per-token columns (old/reference log-probs, advantages) are computed.

``--save-debug-train-data PATH`` (``{rollout_id}`` in PATH is the step): ``torch.save`` of one dict::

    {"rollout_id": int,
     "tokens": [LongTensor[len_i]] (prompt + response, per sample),
     "response_lengths": LongTensor[N], "rewards": FloatTensor[N] (after normalization: what the loss sees),
     "loss_masks": FloatTensor[N, T] (T: the longest response; row i's first response_lengths[i] entries),
     "rollout_log_probs": FloatTensor[N, T] | None, "advantages": FloatTensor[N, T],
     "sample_ids": [(group_index, index) | None]}

``--dump-details DIR``: the same step's details for analysis without torch, one JSON line per sample in
``DIR/rollout_<step>.jsonl``::

    {"rollout_id", "sample_id", "tokens", "response_length", "reward", "loss_mask",
     "rollout_log_probs", "old_log_probs", "ref_log_probs", "advantages"}

(per-token lists over the response; a column the step did not compute is null; old log-probs taken from the
optimizer step's own forward are not known yet when the dump is written and are null).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class TrainDumpConfig(FlagSlice):
    save_debug_train_data: str | None
    dump_details: str | None


def _rows(t: torch.Tensor | None, lengths: list[int]) -> list[list[float] | None]:
    if t is None:
        return [None] * len(lengths)
    return [t[i, :n].tolist() for i, n in enumerate(lengths)]


def dump_step(cfg: TrainDumpConfig, step: int, batch: Any, old_lp: torch.Tensor | None, ref_lp: torch.Tensor | None,
              advantages: torch.Tensor) -> None:
    """Write step ``step``'s files (``batch``: the trainer's RolloutTensors)."""
    if not cfg.save_debug_train_data and not cfg.dump_details:
        return
    samples = batch.samples
    lengths = [s.response_length for s in samples]
    if cfg.save_debug_train_data:
        path = Path(cfg.save_debug_train_data.format(rollout_id=step))
        path.parent.mkdir(parents=True, exist_ok=True)
        torch.save({"rollout_id": step, "tokens": [torch.tensor(s.tokens, dtype=torch.long) for s in samples],
                    "response_lengths": torch.tensor(lengths, dtype=torch.long), "rewards": batch.rewards.cpu(),
                    "loss_masks": batch.loss_mask.cpu(),
                    "rollout_log_probs": None if batch.rollout_log_probs is None else batch.rollout_log_probs.cpu(),
                    "advantages": advantages.detach().cpu(), "sample_ids": [s.sample_id for s in samples]}, path)
    if cfg.dump_details:
        out = Path(cfg.dump_details)
        out.mkdir(parents=True, exist_ok=True)
        columns = {"loss_mask": _rows(batch.loss_mask, lengths),
                   "rollout_log_probs": _rows(batch.rollout_log_probs, lengths),
                   "old_log_probs": _rows(old_lp, lengths), "ref_log_probs": _rows(ref_lp, lengths),
                   "advantages": _rows(advantages.detach().cpu(), lengths)}
        with open(out / f"rollout_{step}.jsonl", "w") as f:
            for i, s in enumerate(samples):
                f.write(json.dumps({"rollout_id": step, "sample_id": s.sample_id, "tokens": s.tokens,
                                    "response_length": s.response_length, "reward": float(batch.rewards[i]),
                                    **{k: v[i] for k, v in columns.items()}}) + "\n")
