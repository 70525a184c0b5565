"""RMSNorm modules for megatron-core's local layer spec that also work under ``--sequence-parallel``.

Why: without Transformer Engine or Apex, the local spec builds its norms with megatron's
`WrappedTorchNorm` (torch.nn.RMSNorm), which refuses sequence parallelism. With SP each tensor-
parallel rank normalises its own slice of the sequence, so a norm weight's gradient is a partial
sum that must be all-reduced over the TP group; megatron-core's `finalize_model_grads` does that for
every parameter tagged ``sequence_parallel`` (what Apex's `FusedLayerNorm` and TE's norms tag).
`HiddenRMSNorm` is torch's RMSNorm with that tag; `HeadRMSNorm` is the q/k norm over ``head_dim``,
which sees the whole sequence (after the qkv projection gathered it) and whose gradient megatron sums
over TP by name.

On CUDA (with triton) both run `rms_norm` compiled by ``torch.compile``: one Triton kernel forward and
one backward. Why: torch's own fused RMSNorm kernels took 21 ms of the 108 ms of GPU time of an RL
step at the GRPO bench's shape (H100, 65 norms, most of them the q/k norms over 64-wide rows, where
its backward is slowest). The function is torch's: normalise in fp32, scale by the weight in fp32,
round once to the input dtype (what its fused kernel computes); elsewhere torch's module forward runs.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from relax.backends.megatron.fusions import recompile_headroom
from relax.utils.modules import module_available

_compiled: dict[str, Any] = {}


@functools.cache
def _triton() -> bool:
    return module_available("triton")


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


def _head_rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return _rms_norm(x, weight, eps)  # its own code object: its own compile cache (`rms_norm`)


_BODIES = {"hidden": _rms_norm, "head": _head_rms_norm}


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, kind: str = "hidden") -> torch.Tensor:
    """RMSNorm over the last dim, compiled on CUDA (module docstring).

    Each ``kind`` compiles its own code object and a no-grad call passes the weight detached, so that the
    variants dynamo keeps per code object stay few: (grad, no grad) x (first shape, dynamic). One shared
    function saw hidden and head shapes (3-D and 4-D), trainable and frozen weights (the reference model)
    and both grad modes, passed dynamo's recompile limit of 8, and then ran some calls eagerly, whose
    rounding differs from the fused kernel's: the no-grad old-log-prob pass and the training forward then
    disagreed (step-0 ppo_kl 1.2e-5 with --use-kl-loss on the H100, tests/gpu/test_megatron_gpu.py)."""
    fn = _compiled.get(kind)
    if fn is None:
        recompile_headroom()
        fn = _compiled[kind] = torch.compile(_BODIES[kind], dynamic=None)  # a new length: one recompile, then dynamic
    return fn(x, weight if torch.is_grad_enabled() else weight.detach(), eps)


class _CompiledOnCuda(torch.nn.RMSNorm):
    kind = "hidden"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.is_cuda and _triton()):
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps if self.eps is not None else torch.finfo(x.dtype).eps, self.kind)


def _check(config, persist_layer_norm: bool, zero_centered_gamma: bool) -> None:
    """The same refusals as megatron's `WrappedTorchNorm` (minus sequence parallelism, which these handle)."""
    if config.normalization != "RMSNorm":
        raise ValueError(f"relax's megatron norms are RMSNorm, not {config.normalization}")
    if (config.layernorm_zero_centered_gamma or zero_centered_gamma or config.persist_layer_norm or persist_layer_norm
            or config.memory_efficient_layer_norm):
        raise ValueError("zero-centered gamma, persistent and memory-efficient layer norms need Apex or TE")


class HiddenRMSNorm(_CompiledOnCuda):
    """A layer's input / pre-MLP norm and the final norm (over ``hidden_size``), tagged for sequence parallelism."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):  # as WrappedTorchNorm: config decides
        _check(config, persist_layer_norm, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


class HeadRMSNorm(_CompiledOnCuda):
    """The Qwen3 q / k norm (over ``head_dim``); megatron all-reduces its gradient over TP by name."""

    kind = "head"

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        _check(config, persist_layer_norm, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps)
