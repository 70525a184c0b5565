"""RMSNorm and RoPE as HF's eager modules round them, shared by the lean runner's forwards and the decode-attention
op's reference (`decode_attention.prepare_qk`), whose Triton kernel must reproduce the same rounding in registers.

Eager, each op rounds its result to the model dtype (HF's order: the normalized value, its product with the weight,
``x * cos``, ``rotate_half(x) * sin``, their sum); under ``torch.compile`` inductor elides the downcast-upcast pairs
inside a fused kernel unless ``emulate_precision_casts`` is set (the lean runner's compiled prefill sets it).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """HF's RMSNorm: normalize in fp32, cast back, then scale (same rounding order)."""
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def sign_folded(sin: torch.Tensor) -> torch.Tensor:
    """The ``sin_signed`` table `rotate` and the decode-attention kernel take: HF's ``sin`` with rotate-half's sign
    folded in (``-sin`` on the first half of the last dim), so the rotation is one product per half."""
    half = sin.shape[-1] // 2
    sign = torch.cat([-torch.ones(half), torch.ones(half)]).to(sin.device, sin.dtype)
    return sin * sign


def rotate(x: torch.Tensor, cos: torch.Tensor, sin_signed: torch.Tensor) -> torch.Tensor:
    """RoPE, HF's half-rotation ``x*cos + rotate_half(x)*sin`` with the sign folded into the table (``sin_signed``:
    ``-sin`` on the first half); eager, each product and the sum round as HF's do (an ``addcmul`` rounds once)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * sin_signed
