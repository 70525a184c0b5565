"""RMSNorm modules for megatron-core's local layer spec that also work under ``--sequence-parallel``.

Why: without Transformer Engine or Apex, the local spec builds its norms with megatron's
`WrappedTorchNorm` (torch.nn.RMSNorm), which refuses sequence parallelism. With SP each tensor-
parallel rank normalises its own slice of the sequence, so a norm weight's gradient is a partial
sum that must be all-reduced over the TP group; megatron-core's `finalize_model_grads` does that for
every parameter tagged ``sequence_parallel`` (what Apex's `FusedLayerNorm` and TE's norms tag).
`HiddenRMSNorm` is torch's RMSNorm with that tag (same forward, so a run without SP computes exactly
what `WrappedTorchNorm` did); `HeadRMSNorm` is the q/k norm over ``head_dim``, which sees the whole
sequence (after the qkv projection gathered it) and whose gradient megatron sums over TP by name.
"""

from __future__ import annotations

import torch


def _check(config, persist_layer_norm: bool, zero_centered_gamma: bool) -> None:
    """The same refusals as megatron's `WrappedTorchNorm` (minus sequence parallelism, which these handle)."""
    if config.normalization != "RMSNorm":
        raise ValueError(f"relax's megatron norms are RMSNorm, not {config.normalization}")
    if (config.layernorm_zero_centered_gamma or zero_centered_gamma or config.persist_layer_norm or persist_layer_norm
            or config.memory_efficient_layer_norm):
        raise ValueError("zero-centered gamma, persistent and memory-efficient layer norms need Apex or TE")


class HiddenRMSNorm(torch.nn.RMSNorm):
    """A layer's input / pre-MLP norm and the final norm (over ``hidden_size``), tagged for sequence parallelism."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):  # as WrappedTorchNorm: config decides
        _check(config, persist_layer_norm, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


class HeadRMSNorm(torch.nn.RMSNorm):
    """The Qwen3 q / k norm (over ``head_dim``); megatron all-reduces its gradient over TP by name."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        _check(config, persist_layer_norm, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps)
