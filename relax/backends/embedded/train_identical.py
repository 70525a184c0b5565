"""``--true-on-policy-mode``: the log-probs an engine reports are the trainer's own computation, bitwise.

The engine samples with its fast path (KV cache, batched decode, its runner's kernels), whose log-probs differ
from a training forward's in the last bits: another reduction order, other shapes. In this mode a finished
request's log-probs are instead recomputed by the call the torch trainer makes for one sample
(`relax.backends.torch.batch.build_model_inputs` of that one unpadded sample, then
`relax.backends.torch.logprobs.response_log_probs`), on the same HF model code with the same weights (every sync
is checksummed), so the same kernels see the same shapes and give the same bits. The trainer, in this mode,
forwards one unpadded sample at a time too (``TrainBackend._micro_batches``). Cost: one more forward over each
finished sample in the engine, and micro-batches of one in the trainer.

The tokens are still drawn from the fast path's distribution; what is exact is the log-prob of each drawn token
under the policy the trainer computes, which is what importance ratios, ``ppo_kl`` and the train/rollout mismatch
metrics compare.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class _Sequence(NamedTuple):
    """What `build_model_inputs` reads of a train sample."""

    tokens: list[int]
    response_length: int


@torch.no_grad()
def train_identical_logprobs(model: torch.nn.Module, tokens: list[int], response_length: int, *, temperature: float,
                             pad_id: int, device: torch.device) -> list[float]:
    """Log-probs of the last ``response_length`` of ``tokens``, as the torch trainer computes them for this sample."""
    from relax.backends.torch.batch import build_model_inputs
    from relax.backends.torch.logprobs import response_log_probs

    if response_length <= 0:
        return []
    inputs = build_model_inputs([_Sequence(tokens, response_length)], response_length, pad_id, device)
    log_probs, _ = response_log_probs(model, inputs, temperature=temperature, with_entropy=False)
    return log_probs[0].tolist()
