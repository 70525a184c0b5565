"""Per-token log-probs and entropy of response tokens under a causal LM.

Logits are divided by the rollout temperature before the softmax, the same convention the
engines use for the log-probs they return, so train/rollout mismatch is measured like for
like. Only the rows of the logits that predict response tokens are materialised as
log-softmax, which keeps memory at ``[b, T, V]`` instead of ``[b, L, V]``.
`log_probs_from_logits` is that convention on its own; every train backend calls it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from relax.backends.torch.batch import ModelInputs


def log_probs_from_logits(
    logits: torch.Tensor, inputs: ModelInputs, *, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``[b, L, V]`` over the whole sequence -> response log-probs (and entropy) ``[b, T]``."""
    vocab = logits.shape[-1]
    index = inputs.logit_positions.unsqueeze(-1).expand(-1, -1, vocab)
    selected = logits.gather(1, index).float()
    if temperature > 0:
        selected = selected / temperature
    log_softmax = F.log_softmax(selected, dim=-1)
    valid = inputs.valid.to(log_softmax.dtype)
    log_probs = log_softmax.gather(-1, inputs.target_ids.unsqueeze(-1)).squeeze(-1) * valid
    entropy = None
    if with_entropy:
        entropy = -(log_softmax.exp() * log_softmax).sum(-1) * valid
    return log_probs, entropy


def response_log_probs(
    model: torch.nn.Module, inputs: ModelInputs, *, temperature: float, with_entropy: bool
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    return log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=with_entropy)
