"""RMSNorm modules for megatron-core's local layer spec that also work under ``--sequence-parallel``.

Why: without Transformer Engine or Apex, the local spec builds its norms with megatron's
`WrappedTorchNorm` (torch.nn.RMSNorm), which refuses sequence parallelism. With SP each tensor-
parallel rank normalises its own slice of the sequence, so a norm weight's gradient is a partial
sum that must be all-reduced over the TP group; megatron-core's `finalize_model_grads` does that for
every parameter tagged ``sequence_parallel`` (what Apex's `FusedLayerNorm` and TE's norms tag).
`HiddenRMSNorm` is torch's RMSNorm with that tag; `HeadRMSNorm` is the q/k norm over ``head_dim``,
which sees the whole sequence (after the qkv projection gathered it) and whose gradient megatron sums
over TP by name.

On CUDA (with triton) both run `rms_norm`: one Triton kernel forward, launched directly (forward_kernels.py),
and one compiled backward (compiled_function.py); the same forward kernel in no-grad and training passes, bitwise. Why compiled:
torch's own fused RMSNorm kernels took 21 ms of the 108 ms of GPU time of an RL step at the GRPO
bench's shape (H100, 65 norms, most of them the q/k norms over 64-wide rows, where its backward is
slowest). The forward is torch's: normalise in fp32, scale by the weight in fp32, round once to the
input dtype (what its fused kernel computes); the backward is the closed form in fp32; elsewhere
torch's module forward runs.
"""

from __future__ import annotations

import functools

import torch

from relax.backends.megatron.compiled_function import CompiledOnCuda, direct_kernels, records_grad
from relax.utils.modules import module_available


@functools.cache
def _triton() -> bool:
    return module_available("triton")


def _wide(t: torch.Tensor) -> torch.Tensor:
    """fp32 for bf16/fp16/fp32 (the kernels' math), float64 stays float64 (the CPU tests' references)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


def _rms_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = _wide(x)
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * _wide(weight)).to(x.dtype)


def _rms_backward(grad: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, eps: float):
    """d/dx and d/dweight of `_rms_forward`: with r = rsqrt(mean(x^2) + eps) and gw = grad * weight,
    dx = r * (gw - x * r^2 * mean(gw * x)), dweight = sum over rows of grad * x * r (all fp32)."""
    xf, g = _wide(x), _wide(grad)
    r = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    gw = g * _wide(weight)
    dx = r * (gw - xf * (r * r) * (gw * xf).mean(-1, keepdim=True))
    dweight = (g * xf * r).reshape(-1, x.shape[-1]).sum(0)
    return dx.to(x.dtype), dweight.to(weight.dtype)


_FORWARD, _BACKWARD = CompiledOnCuda(_rms_forward, static_trailing=1), CompiledOnCuda(_rms_backward, static_trailing=1)


def _forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """The forward kernel of both passes: the direct Triton launch (forward_kernels.py: no torch.compile call path
    on the host-bound forward) where it serves, else the compiled function (eager off CUDA)."""
    kernels = direct_kernels() if x.is_cuda else None
    if kernels is not None and kernels.takes(x):
        return kernels.rms_norm_forward(x, weight, eps)
    return _FORWARD(x, weight, eps)


class _RMSNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
        ctx.save_for_backward(x, weight)
        ctx.eps = eps
        return _forward(x.detach(), weight.detach(), eps)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x, weight = ctx.saved_tensors
        dx, dweight = _BACKWARD(grad.detach(), x.detach(), weight.detach(), ctx.eps)
        return dx, dweight, None


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """RMSNorm over the last dim: compiled on CUDA, eager elsewhere; the same forward kernel with or without
    autograd recording (compiled_function.py)."""
    if records_grad(x, weight):
        return _RMSNorm.apply(x, weight, eps)
    return _forward(x.detach(), weight.detach(), eps)


class _CompiledRMSNorm(torch.nn.RMSNorm):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not (x.is_cuda and _triton()):
            return super().forward(x)
        return rms_norm(x, self.weight, self.eps if self.eps is not None else torch.finfo(x.dtype).eps)


def _check(config, persist_layer_norm: bool, zero_centered_gamma: bool) -> None:
    """The same refusals as megatron's `WrappedTorchNorm` (minus sequence parallelism, which these handle)."""
    if config.normalization != "RMSNorm":
        raise ValueError(f"relax's megatron norms are RMSNorm, not {config.normalization}")
    if (config.layernorm_zero_centered_gamma or zero_centered_gamma or config.persist_layer_norm or persist_layer_norm
            or config.memory_efficient_layer_norm):
        raise ValueError("zero-centered gamma, persistent and memory-efficient layer norms need Apex or TE")


class HiddenRMSNorm(_CompiledRMSNorm):
    """A layer's input / pre-MLP norm and the final norm (over ``hidden_size``), tagged for sequence parallelism."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):  # as WrappedTorchNorm: config decides
        _check(config, persist_layer_norm, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps)
        self.weight.sequence_parallel = bool(config.sequence_parallel)


class HeadRMSNorm(_CompiledRMSNorm):
    """The Qwen3 q / k norm (over ``head_dim``); megatron all-reduces its gradient over TP by name."""

    def __init__(self, config, hidden_size: int, eps: float = 1e-5, persist_layer_norm: bool = False,
                 zero_centered_gamma: bool = False, normalization: str = "RMSNorm"):
        _check(config, persist_layer_norm, zero_centered_gamma)
        super().__init__(hidden_size, eps=eps)
