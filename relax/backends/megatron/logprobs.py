"""Response-token log-probs under a megatron-core GPTModel, in the torch backend's convention.

The model sees the same right-padded micro-batch as the HF model (`build_model_inputs`):
positions ``0..L-1`` and Megatron's causal mask (``attention_mask=None``). Padding sits after
every real token, so under a causal mask it never changes a real token's logits. The logits
then go through the shared `log_probs_from_logits` (temperature, log-softmax, entropy).
"""

from __future__ import annotations

import torch

from relax.backends.torch.batch import ModelInputs
from relax.backends.torch.logprobs import log_probs_from_logits


def gpt_logits(model: torch.nn.Module, inputs: ModelInputs) -> torch.Tensor:
    """``[b, L, V]`` logits (fp32 out of Megatron's Float16Module) for a right-padded micro-batch."""
    b, length = inputs.input_ids.shape
    position_ids = torch.arange(length, device=inputs.input_ids.device).unsqueeze(0).expand(b, -1)
    return model(input_ids=inputs.input_ids, position_ids=position_ids, attention_mask=None)


def mcore_response_log_probs(
    model: torch.nn.Module, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = gpt_logits(model, inputs)
    return log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=with_entropy,
                                 chunk_size=chunk_size)
