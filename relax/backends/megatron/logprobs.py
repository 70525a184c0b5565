"""Response-token log-probs under a megatron-core GPTModel, in the torch backend's convention.

The model sees the same right-padded micro-batch as the HF model (`build_model_inputs`):
positions ``0..L-1`` and Megatron's causal mask (``attention_mask=None``). Padding sits after
every real token, so under a causal mask it never changes a real token's logits. With
``--sequence-parallel`` the sequence is split over the tensor-parallel ranks, so it is padded
further, on the right, to a multiple of the TP size. On the last pipeline stage the logits go through the
shared `log_probs_from_logits` (temperature, log-softmax, entropy), which reads only the real positions and
the real vocabulary's columns (the model's vocabulary is padded to a multiple of the TP size): the fused
path reads the padded tensor in place, the reference path slices it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from relax.backends.torch.batch import ModelInputs
from relax.backends.torch.logprobs import log_probs_from_logits


def gpt_forward(model: torch.nn.Module, inputs: ModelInputs, *, seq_multiple: int = 1, pad_id: int = 0) -> torch.Tensor:
    """One stage's output for a right-padded micro-batch: ``[b, L', V']`` bf16 logits on the last pipeline stage
    (``L'`` / ``V'`` padded), the hidden states for the next stage elsewhere.

    ``fp32_output=False``: Megatron's Float16Module would otherwise upcast all ``b x L x V`` logits
    (2 GB at 8 x 2048 x 32k); `log_probs_from_logits` upcasts only the rows of response tokens,
    which gives the same fp32 values (the cast is exact) and the same gradients.
    """
    ids = inputs.input_ids
    extra = -ids.shape[1] % seq_multiple
    if extra:
        ids = F.pad(ids, (0, extra), value=pad_id)
    b, length = ids.shape
    position_ids = torch.arange(length, device=ids.device).unsqueeze(0).expand(b, -1)
    return model(input_ids=ids, position_ids=position_ids, attention_mask=None, fp32_output=False)


def response_log_probs_from_logits(
    logits: torch.Tensor, inputs: ModelInputs, *, vocab_size: int, temperature: float, with_entropy: bool,
    chunk_size: int = -1,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probs (and entropy) of the response tokens from the last stage's padded logits (only real positions
    are read; the padded vocabulary columns are left out of the softmax and get a zero gradient)."""
    return log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=with_entropy,
                                 chunk_size=chunk_size, vocab_size=vocab_size)


def mcore_response_log_probs(
    model: torch.nn.Module, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Both steps on a model of one pipeline stage, without sequence parallelism."""
    logits = gpt_forward(model, inputs)
    return response_log_probs_from_logits(logits, inputs, vocab_size=vocab_size or logits.shape[-1],
                                          temperature=temperature, with_entropy=with_entropy, chunk_size=chunk_size)
