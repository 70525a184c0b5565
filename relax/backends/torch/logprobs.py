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

On CUDA, when Triton imports, the same values come from fused kernels instead
(`relax.backends.torch.logprobs_triton`): they read each selected row of the logits once in the
forward and once in the backward and keep only three fp32 numbers per token in between, where the
reference path above builds several ``[n, V]`` fp32 tensors each way (forward and backward with
entropy at 16k tokens, a 32k vocabulary, bf16 on an H200: 25 ms and 8.8 GiB of temporaries for the
reference, 1.8 ms and none fused). With nothing ``[n, V]`` to bound, the fused path ignores
``chunk_size`` (its results would be the same for every chunking). It reads the first
``vocab_size`` columns of padded logits (Megatron's) in place; the reference path slices them.
``TRITON_INTERPRET=1`` sends CPU tensors through it too (the Triton interpreter: how CI tests the
kernels); other CPU runs take the reference path.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

from relax.backends.torch.batch import ModelInputs
from relax.backends.torch.vision_inputs import model_forward
from relax.utils.modules import optional_module

_FUSED_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


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


def _triton_log_probs():
    """The Triton kernels' module, or None where Triton is missing (the reference runs then)."""
    return optional_module("relax.backends.torch.logprobs_triton", "log-probs run the reference path (slower)")


def fused_log_probs_available(logits: torch.Tensor) -> bool:
    """Whether `log_probs_from_logits` takes the fused Triton path for these logits (module docstring)."""
    on_device = logits.is_cuda or os.environ.get("TRITON_INTERPRET") == "1"
    return (on_device and logits.dtype in _FUSED_DTYPES and logits.dim() == 3 and logits.stride(-1) == 1
            and _triton_log_probs() is not None)


def log_probs_from_logits(
    logits: torch.Tensor, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``logits`` ``[b, L, V']`` over the whole sequence -> response log-probs (and entropy) ``[b, T]``.

    Padding positions (``t >= response_length``) are 0. ``chunk_size`` > 0: at most that many
    tokens' log-softmax at a time on the reference path (module docstring). ``vocab_size``: only
    the first that many columns of the logits are the vocabulary (default: all ``V'``).
    """
    vocab_size = logits.shape[-1] if vocab_size is None else vocab_size
    rows, cols = inputs.valid.nonzero(as_tuple=True)
    positions = inputs.logit_positions[rows, cols]
    targets = inputs.target_ids[rows, cols]
    if fused_log_probs_available(logits):
        lp, ent = _triton_log_probs().fused_token_log_probs(
            logits, rows, positions, targets, vocab_size=vocab_size, temperature=temperature,
            with_entropy=with_entropy)
        lp_parts, ent_parts = [lp], [ent]
    else:
        lp_parts, ent_parts = _reference_parts(logits[..., :vocab_size], rows, positions, targets,
                                               temperature, with_entropy, chunk_size)
    shape = inputs.valid.shape
    zeros = torch.zeros(shape, dtype=torch.float32, device=logits.device)
    log_probs = zeros.index_put((rows, cols), torch.cat(lp_parts))
    entropy = zeros.index_put((rows, cols), torch.cat(ent_parts)) if with_entropy else None
    return log_probs, entropy


def _reference_parts(
    logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor,
    temperature: float, with_entropy: bool, chunk_size: int,
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """`_token_log_probs` chunk by chunk: the log-probs and entropies of each chunk, in order."""
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
    return lp_parts, ent_parts


def response_log_probs(
    model: torch.nn.Module, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = model_forward(model, inputs.input_ids, inputs.attention_mask, inputs.vision)
    return log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=with_entropy,
                                 chunk_size=chunk_size)
