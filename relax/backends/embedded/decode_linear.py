"""A decode step's projection ``x @ weight.T + bias``, as one op the lean runner's decode forward calls.

Why an op of its own: on CUDA, for the few rows of a decode batch (<= 64), it runs the Triton skinny GEMM
of `relax.backends.embedded.triton_linear`, launched with programmatic dependent launch on Hopper so it
overlaps the tail of the kernel before it; there, each projection is bound by a kernel's fixed cost, not by
its tiles. Everywhere else (CPU, larger batches, shapes the kernel does not tile, no Triton) it is
``F.linear``. A ``torch.library`` custom op, so ``torch.compile`` keeps it as one opaque call and a CUDA
graph captures its kernel like any other; the prefill keeps ``F.linear``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from relax.utils.modules import optional_module


@torch.library.custom_op("relax::decode_linear", mutates_args=())
def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """See the module docstring; this is the CPU (and fallback) implementation."""
    return F.linear(x, weight, bias)


@decode_linear.register_fake
def _(x, weight, bias=None):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@decode_linear.register_kernel("cuda")
def _(x, weight, bias=None):
    kernel = _triton_linear()
    if kernel is None or not kernel.supports(x, weight):
        return F.linear(x, weight, bias)
    return kernel.skinny_linear(x, weight, bias)


def _triton_linear():
    """The Triton kernel's module, or None where Triton is missing (``F.linear`` runs then)."""
    return optional_module("relax.backends.embedded.triton_linear", "decode projections run F.linear")
