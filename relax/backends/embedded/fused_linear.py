"""A decode-step projection with what surrounds it, as one op: ``[RMSNorm ->] linear [-> silu(gate) * up] [+ residual]``.

Why an op of its own: on the H100 at batch 64 (docs/results/bench_engine_h100.json's profile) a lean
decode layer was ~11 kernels, the four projections ran at 0.5-1.7 TB/s (cuBLAS picks split-K tiles for
M = 64 and adds a reduce kernel) and the norms and the SiLU product were kernels of their own between
them. On CUDA in half precision, for at most 64 rows, this op is one Triton kernel
(`relax.backends.embedded.triton_linear`) that streams the weight once and does the norm in its
prologue, the gate/up product and residual add in its epilogue; a layer becomes 6 kernels (QKV with
its norm, the q/k-norm + RoPE fusion, attention, ``o_proj`` + residual, gate/up with its norm and
SiLU, ``down_proj`` + residual). Elsewhere (CPU, fp32, more rows: prefill) it runs
`reference_fused_linear`, the unfused PyTorch ops the runner ran before.

``torch.library`` custom op: ``torch.compile`` keeps it as one opaque call and fuses what is
around it; a CUDA graph captures it like any other kernel.

Arguments: ``x [M, K]``; ``weight [N, K]`` (``[2N, K]``, gate rows then up rows, when ``gated``);
``norm_weight [K]`` or None (RMSNorm of ``x`` with ``eps`` first); ``bias [N]`` or None (not with
``gated``: the lean runner refuses gate/up biases);
``residual [M, N]`` or None (added last). Returns ``[M, N]``.
"""

from __future__ import annotations

import functools
import logging

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalize in fp32, cast back, then scale (same rounding order)."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def reference_fused_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None,
                           bias: torch.Tensor | None, residual: torch.Tensor | None, eps: float,
                           gated: bool) -> torch.Tensor:
    """The unfused ops, in HF's order and rounding (any leading shape of ``x``)."""
    if gated and bias is not None:
        raise ValueError("fused_linear: a gated (gate/up) projection with a bias is not supported")
    if norm_weight is not None:
        x = rms_norm(x, norm_weight, eps)
    y = F.linear(x, weight, bias)
    if gated:
        gate, up = y.chunk(2, -1)
        y = F.silu(gate) * up
    return y if residual is None else residual + y


@torch.library.custom_op("relax::fused_linear", mutates_args=())
def fused_linear(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None, bias: torch.Tensor | None,
                 residual: torch.Tensor | None, eps: float, gated: bool) -> torch.Tensor:
    """See the module docstring; this is the CPU (and fallback) implementation."""
    return reference_fused_linear(x, weight, norm_weight, bias, residual, eps, gated)


@fused_linear.register_fake
def _(x, weight, norm_weight, bias, residual, eps, gated):
    return x.new_empty((x.shape[0], weight.shape[0] // (2 if gated else 1)))


@fused_linear.register_kernel("cuda")
def _(x, weight, norm_weight, bias, residual, eps, gated):
    kernel = _triton_linear()
    if kernel is None or (gated and bias is not None) or not kernel.supports(x, weight):
        return reference_fused_linear(x, weight, norm_weight, bias, residual, eps, gated)
    return kernel.launch(x, weight, norm_weight, bias, residual, eps, gated)


@functools.cache
def _triton_linear():
    """The Triton module, or None (logged once) where Triton is missing: the reference runs then."""
    try:
        from relax.backends.embedded import triton_linear
    except ImportError as exc:
        log.warning("Triton is not importable (%s): fused projections run the reference (slower)", exc)
        return None
    return triton_linear
