"""A decode step's projection ``x @ weight.T + bias``, as one op the lean runner's decode forward calls.

Why an op of its own: on CUDA, for the few rows of a decode batch (<= 64), it runs the Triton skinny GEMM
of `relax.backends.embedded.triton_linear`, launched with programmatic dependent launch on Hopper so it
overlaps the tail of the kernel before it; there, each projection is bound by a kernel's fixed cost, not by
its tiles. With ``glu`` it is the MLP's gate/up projection with ``silu(gate) * up`` in the kernel's
epilogue (one kernel fewer per layer, rounded as the two ops round it). Everywhere else (CPU, larger
batches, shapes the kernel does not tile, no Triton) it is ``F.linear`` (`reference`). A ``torch.library``
custom op, so ``torch.compile`` keeps it as one opaque call and a CUDA graph captures its kernel like any
other; the prefill keeps ``F.linear``.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from relax.utils.modules import optional_module


def reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """``F.linear``; with ``glu`` (a fused gate/up weight, ``[2I, K]``) then ``silu(gate) * up`` of its halves."""
    out = F.linear(x, weight, bias)
    if not glu:
        return out
    gate, up = out.chunk(2, -1)
    return F.silu(gate) * up


@torch.library.custom_op("relax::decode_linear", mutates_args=())
def decode_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  glu: bool = False) -> torch.Tensor:
    """See the module docstring; this is the CPU (and fallback) implementation."""
    return reference(x, weight, bias, glu)


@decode_linear.register_fake
def _(x, weight, bias=None, glu=False):
    return x.new_empty((*x.shape[:-1], weight.shape[0] // 2 if glu else weight.shape[0]))


@decode_linear.register_kernel("cuda")
def _(x, weight, bias=None, glu=False):
    kernel = _triton_linear()
    if kernel is None or not kernel.supports(x, weight, glu=glu) or (glu and bias is not None):
        return reference(x, weight, bias, glu)
    return kernel.skinny_linear(x, weight, bias, glu=glu)


def glu_rows(weight: torch.Tensor) -> int:
    """How many rows (at most) a ``glu`` call with this gate/up weight runs in one kernel on its device (0: none),
    so a caller that would get the unfused fallback keeps ``silu(gate) * up`` outside, where ``torch.compile``
    fuses it. ``RELAX_DECODE_GLU=0`` in the engine's environment says 0 (an A/B)."""
    if weight.device.type != "cuda" or os.environ.get("RELAX_DECODE_GLU", "1") == "0":
        return 0
    kernel = _triton_linear()
    if kernel is None or weight.dtype not in (torch.float16, torch.bfloat16) or not kernel.tiles(weight, glu=True):
        return 0
    return kernel.MAX_ROWS


def _triton_linear():
    """The Triton kernel's module, or None where Triton is missing (``F.linear`` runs then)."""
    return optional_module("relax.backends.embedded.triton_linear", "decode projections run F.linear")
