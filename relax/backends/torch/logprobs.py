"""Per-token log-probs and entropy of response tokens under a causal LM.

Logits are divided by the rollout temperature before the softmax, the same convention the
engines use for the log-probs they return, so train/rollout mismatch is measured like for
like. Only the rows of the logits that predict real response tokens are materialised as
log-softmax (``[n, V]`` for the ``n`` valid tokens, not ``[b, L, V]``).
`log_probs_from_logits` is that convention on its own; every train backend calls it.

``--log-probs-chunk-size C`` (> 0) computes those rows ``C`` tokens at a time. Each token's
row is computed by the same ops whatever the chunking, so the results are identical. With
gradients on, each chunk runs under activation checkpointing: only the logits (which the
model already holds) are kept, and a chunk's ``[C, V]`` fp32 log-softmax (and entropy terms)
is recomputed in the backward, so the peak extra memory is one chunk instead of all tokens.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from relax.backends.torch.batch import ModelInputs


def _token_log_probs(
    logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor,
    temperature: float, with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of each ``targets[i]`` under ``logits[rows[i], positions[i]]`` (and that row's entropy)."""
    selected = logits[rows, positions].float()
    if temperature > 0:
        selected = selected / temperature
    log_softmax = F.log_softmax(selected, dim=-1)
    log_probs = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:
        return log_probs, log_probs.new_zeros(())
    return log_probs, -(log_softmax.exp() * log_softmax).sum(-1)


def log_probs_from_logits(
    logits: torch.Tensor, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``[b, L, V]`` over the whole sequence -> response log-probs (and entropy) ``[b, T]``.

    Padding positions (``t >= response_length``) are 0. ``chunk_size`` > 0: at most that many
    tokens' log-softmax at a time (module docstring).
    """
    rows, cols = inputs.valid.nonzero(as_tuple=True)
    positions = inputs.logit_positions[rows, cols]
    targets = inputs.target_ids[rows, cols]
    n = int(rows.numel())
    size = chunk_size if chunk_size > 0 else max(n, 1)
    recompute = chunk_size > 0 and torch.is_grad_enabled() and logits.requires_grad
    lp_parts, ent_parts = [], []
    for start in range(0, max(n, 1), size):  # one (empty) chunk when n == 0 keeps the autograd graph
        part = slice(start, start + size)
        call_args = (logits, rows[part], positions[part], targets[part], temperature, with_entropy)
        if recompute:
            lp, ent = checkpoint(_token_log_probs, *call_args, use_reentrant=False)
        else:
            lp, ent = _token_log_probs(*call_args)
        lp_parts.append(lp)
        ent_parts.append(ent)
    shape = inputs.valid.shape
    zeros = torch.zeros(shape, dtype=torch.float32, device=logits.device)
    log_probs = zeros.index_put((rows, cols), torch.cat(lp_parts))
    entropy = zeros.index_put((rows, cols), torch.cat(ent_parts)) if with_entropy else None
    return log_probs, entropy


def response_log_probs(
    model: torch.nn.Module, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = model(input_ids=inputs.input_ids, attention_mask=inputs.attention_mask).logits
    return log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=with_entropy,
                                 chunk_size=chunk_size)
