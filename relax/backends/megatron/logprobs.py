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

import functools
import inspect

import torch
import torch.nn.functional as F

from relax.backends.torch.batch import ModelInputs
from relax.backends.torch.logprobs import log_probs_from_logits


def gpt_forward(model: torch.nn.Module, inputs: ModelInputs, *, seq_multiple: int = 1, pad_id: int = 0) -> torch.Tensor:
    """One stage's output for a right-padded micro-batch: ``[b, L', V']`` bf16 logits on the last pipeline stage
    (``L'`` / ``V'`` padded; a view of the output layer's ``[L', b, V']`` tensor, `logits_view`), the hidden
    states for the next stage elsewhere.

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
    processor = {"output_processor": logits_view} if _takes_output_processor() else {}
    return model(input_ids=ids, position_ids=position_ids, attention_mask=None, fp32_output=False, **processor)


def logits_view(*, hidden_states: torch.Tensor, output_layer, output_weight, runtime_gather_output, scale_logits,
                **_unused) -> torch.Tensor:
    """The last stage's output (GPTModel's ``output_processor`` hook): the output layer's ``[L, b, V']`` logits as a
    ``[b, L, V']`` view, where GPTModel without labels returns ``logits.transpose(0, 1).contiguous()``.

    Why: that copy of every logit (1.6 GB in bf16 at the GRPO bench's 64 x 384 tokens x 32k vocabulary) took
    2.1 ms on the H100, and its backward two more (the output layer's backward made the transposed gradient
    contiguous twice): 6.2 ms of the 97 ms of kernels of an RL step. `log_probs_from_logits` reads the rows
    of the view in place and lays the gradient out as the view is (`logprobs_triton`), so nothing is copied.
    What GPTModel does to the logits before that copy, the output layer and its logit scaling, is done here
    the same way; the hook is called only when no labels are passed (relax computes its own losses)."""
    logits, _ = output_layer(hidden_states, weight=output_weight, runtime_gather_output=runtime_gather_output)
    return scale_logits(logits).transpose(0, 1)


@functools.cache
def _takes_output_processor() -> bool:
    """megatron-core's GPTModel takes the ``output_processor`` hook (0.19.2, the wheelhouse's, does); else its own copy stays."""
    from megatron.core.models.gpt.gpt_model import GPTModel

    return "output_processor" in inspect.signature(GPTModel.forward).parameters


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
