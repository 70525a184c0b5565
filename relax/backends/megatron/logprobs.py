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
    """``[b, L, V]`` logits in the model's dtype (bf16) for a right-padded micro-batch.

    ``fp32_output=False``: Megatron's Float16Module would otherwise upcast all ``b x L x V`` logits
    (2 GB at 8 x 2048 x 32k); `log_probs_from_logits` upcasts only the rows of response tokens,
    which gives the same fp32 values (the cast is exact) and the same gradients.
    """
    b, length = inputs.input_ids.shape
    position_ids = torch.arange(length, device=inputs.input_ids.device).unsqueeze(0).expand(b, -1)
    return model(input_ids=inputs.input_ids, position_ids=position_ids, attention_mask=None, fp32_output=False)


def mcore_response_log_probs(
    model: torch.nn.Module, inputs: ModelInputs, *, temperature: float, with_entropy: bool, chunk_size: int = -1
) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = gpt_logits(model, inputs)
    return log_probs_from_logits(logits, inputs, temperature=temperature, with_entropy=with_entropy,
                                 chunk_size=chunk_size)
