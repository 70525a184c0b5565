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

from relax.backends.embedded.sm_count import sm_count
from relax.utils.modules import optional_module

PARTIAL_ROWS = 64  # the most rows `decode_linear_partials` takes in one kernel (triton_linear.BLOCK_M, a test checks)


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


def reference_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int) -> torch.Tensor:
    """``[splits, M, N]`` fp32: ``x @ weight.T`` over ``splits`` consecutive K ranges, the bias in the first."""
    out = torch.stack([F.linear(xs.float(), ws.float()) for xs, ws in zip(x.chunk(splits, -1), weight.chunk(splits, -1),
                                                                          strict=True)])
    if bias is not None:
        out[0] += bias.float()
    return out


@torch.library.custom_op("relax::decode_linear_partials", mutates_args=())
def decode_linear_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int) -> torch.Tensor:
    """A decode projection split along K: fp32 partials ``[splits, M, N]`` that the caller adds in split order and
    rounds to the model dtype (`add_partials`), inside its next fused kernel. ``splits`` comes from
    `partial_splits`; this is the CPU (and fallback) implementation."""
    return reference_partials(x, weight, bias, splits)


@decode_linear_partials.register_fake
def _(x, weight, bias, splits):
    return x.new_empty((splits, *x.shape[:-1], weight.shape[0]), dtype=torch.float32)


@decode_linear_partials.register_kernel("cuda")
def _(x, weight, bias, splits):
    kernel = _triton_linear()
    if kernel is None or not kernel.supports(x, weight) or x.shape[0] > kernel.BLOCK_M:
        return reference_partials(x, weight, bias, splits)
    return kernel.skinny_partials(x, weight, bias, splits)


def add_partials(partials: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """`decode_linear_partials`' output summed in split order and rounded once to ``dtype``: pointwise adds, which
    ``torch.compile`` fuses into the kernel that consumes the projection."""
    out = partials[0]
    for part in partials[1:]:
        out = out + part
    return out.to(dtype)


def partial_splits(weight: torch.Tensor) -> int:
    """K splits for `decode_linear_partials` through this weight on its device, for up to `PARTIAL_ROWS` rows
    (`triton_linear.split_count`); 1 (use `decode_linear`) off CUDA, without Triton, for weights the kernel does not
    tile, or with ``RELAX_DECODE_SPLITK=0`` in the engine's environment (an A/B)."""
    if weight.device.type != "cuda" or os.environ.get("RELAX_DECODE_SPLITK", "1") == "0":
        return 1
    kernel = _triton_linear()
    if kernel is None or weight.dtype not in (torch.float16, torch.bfloat16) or not kernel.tiles(weight):
        return 1
    return kernel.split_count(weight.shape[0], weight.shape[1], sm_count(weight.device))


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
