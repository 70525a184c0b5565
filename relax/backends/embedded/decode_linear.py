"""A decode step's projection ``x @ weight.T + bias``, as one op the lean runner's decode forward calls, with
the elementwise work around it optionally fused in: the RMSNorm before it, the MLP's ``silu(gate) * up``
before it, the residual add after it.

Why an op of its own: on CUDA, for the few rows of a decode batch (<= 64), it runs the Triton skinny GEMM
of `relax.backends.embedded.triton_linear`, launched with programmatic dependent launch on Hopper so it
overlaps the tail of the kernel before it; there, each projection is bound by a kernel's fixed cost, not by
its tiles, and so was each of the small norm / activation / add kernels between the projections: fused,
a layer's decode step is six kernels instead of nine. Everywhere else (CPU, larger batches, shapes the
kernel does not tile, no Triton) it is the same math unfused (`reference`). A ``torch.library`` custom op,
so ``torch.compile`` keeps it as one opaque call and a CUDA graph captures its kernel like any other; the
prefill keeps ``F.linear``.

Rounding, fused: the norm multiplies ``x`` by its weight in the K-loop and each row's ``1/rms`` on the fp32
sums at the end (one rounding of ``x * weight`` to the model dtype where the unfused norm rounds
``x / rms`` and then the product); the gate and the residual add round as the unfused ops do.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from relax.utils.modules import optional_module


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
              norm_weight: torch.Tensor | None = None, eps: float = 0.0, gated: bool = False,
              residual: torch.Tensor | None = None) -> torch.Tensor:
    """The unfused math: ``residual + linear(f(x))`` with ``f`` HF's RMSNorm (``norm_weight``), the gated SiLU
    of ``x = [gate | up]`` (``gated``) or nothing."""
    if norm_weight is not None and gated:
        raise ValueError("decode_linear: a norm or a gate, not both")
    if norm_weight is not None:
        x = norm_weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)
    elif gated:
        gate, up = x.chunk(2, -1)
        x = F.silu(gate) * up
    out = F.linear(x, weight, bias)
    return out if residual is None else residual + out


@torch.library.custom_op("relax::decode_linear", mutates_args=())
def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  norm_weight: torch.Tensor | None = None, eps: float = 0.0, gated: bool = False,
                  residual: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring; this is the CPU (and fallback) implementation."""
    return reference(x, weight, bias, norm_weight, eps, gated, residual)


@decode_linear.register_fake
def _(x, weight, bias=None, norm_weight=None, eps=0.0, gated=False, residual=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@decode_linear.register_kernel("cuda")
def _(x, weight, bias=None, norm_weight=None, eps=0.0, gated=False, residual=None):
    kernel = _triton_linear()
    if kernel is None or not kernel.supports(x, weight, gated=gated):
        return reference(x, weight, bias, norm_weight, eps, gated, residual)
    return kernel.skinny_linear(x, weight, bias, norm_weight=norm_weight, eps=eps, gated=gated, residual=residual)


def fused_available(device: torch.device, k: int, n: int) -> bool:
    """Whether a decode projection of ``K = k``, ``N = n`` runs the fused Triton kernel on ``device`` (for the
    rows it takes, `MAX_ROWS`): a caller that cannot fuse keeps the norm, gate and add outside, where
    ``torch.compile`` fuses them into its own kernels instead of the op running them unfused.
    ``RELAX_DECODE_FUSED=0`` in the engine's environment says no (an A/B)."""
    if device.type != "cuda" or os.environ.get("RELAX_DECODE_FUSED", "1") == "0":
        return False
    kernel = _triton_linear()
    return kernel is not None and kernel.fits(k, n)


def fused_rows() -> int:
    """The most rows the fused kernel takes (`relax.backends.embedded.triton_linear.MAX_ROWS`)."""
    kernel = _triton_linear()
    return kernel.MAX_ROWS if kernel is not None else 0


def _triton_linear():
    """The Triton kernel's module, or None where Triton is missing (``F.linear`` runs then)."""
    return optional_module("relax.backends.embedded.triton_linear", "decode projections run F.linear")
