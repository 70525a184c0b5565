"""``--rollout-data-postprocess-path``: a user hook over one step's training data, run in the trainer.

Relax calls it once everything is fetched (old/reference log-probs, advantages) and before the
optimizer steps, typically to edit the loss mask. It gets Relax's ``rollout_data`` dict, whose
per-token columns are ``[N, T]`` tensors over response tokens (right-padded, as the trainer holds
them); ``entropy`` is the old policy's per-token entropy with ``--use-rollout-entropy`` (None without),
for a loss mask that keeps, say, only high-entropy tokens. It may edit ``loss_masks`` / ``advantages`` in place or return a dict with replacements;
the trainer trains on what the dict holds afterwards.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from relax.backends.torch.batch import RolloutTensors
from relax.utils.plugins import PluginError, culprit, load_function

if TYPE_CHECKING:
    from relax.backends.config import TrainerConfig

FLAG = "--rollout-data-postprocess-path"
SIGNATURE = "rollout_data_postprocess(args, rollout_id, rollout_data: dict) -> dict | None"
EDITABLE = ("loss_masks", "advantages")


def postprocess_rollout_data(cfg: TrainerConfig, rollout_id: int, batch: RolloutTensors, log_probs: torch.Tensor,
                             ref_log_probs: torch.Tensor | None, adv: Any, *, entropy: torch.Tensor | None = None) -> None:
    """Run the hook (when set) and write its ``loss_masks`` / ``advantages`` back into the step's tensors.
    The hook gets ``cfg.args``: its seed 000 signature takes the whole namespace."""
    path = cfg.rollout_data_postprocess_path
    if not path:
        return
    fn = load_function(path, flag=FLAG, signature=SIGNATURE, min_args=3)
    data = {
        "tokens": [list(s.tokens) for s in batch.samples],
        "response_lengths": [s.response_length for s in batch.samples],
        "rewards": batch.rewards.clone(),
        "loss_masks": batch.loss_mask,
        "log_probs": log_probs,
        "ref_log_probs": ref_log_probs,
        "rollout_log_probs": batch.rollout_log_probs,
        "advantages": adv.advantages,
        "returns": adv.returns,
        "entropy": entropy,  # --use-rollout-entropy: the old policy's per-token entropy (else None)
    }
    with culprit(FLAG, path, f"rollout {rollout_id}"):
        out = fn(cfg.args, rollout_id, data)
    if out is not None and not isinstance(out, dict):
        raise PluginError(f"{FLAG} returned {type(out).__name__}; expected {SIGNATURE}")
    result = data if out is None else out
    for key, target in (("loss_masks", batch.loss_mask), ("advantages", adv.advantages)):
        value = result.get(key, target)
        if not isinstance(value, torch.Tensor) or value.shape != target.shape:
            shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
            raise PluginError(f"{FLAG}: {key!r} must stay a tensor of shape {tuple(target.shape)}, got {shape}")
        if value is not target:
            target.copy_(value)
