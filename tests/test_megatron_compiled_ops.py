"""The trainer's RMSNorm and RoPE autograd functions (relax/backends/megatron/norms.py, rope_fusion.py).

On CUDA their forward and backward are compiled (tests/gpu/test_megatron_fusions_gpu.py checks them in bf16
against float64 and torch's own ops); here the same functions run eagerly in float64, so the hand-written
backward formulas are checked against autograd's numerical gradients, and the outputs against formulas
written out independently.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.megatron.norms import rms_norm
from relax.backends.megatron.rope_fusion import fused_rope_bshd


@settings(max_examples=20, deadline=None)
@given(rows=st.integers(1, 5), width=st.sampled_from([1, 4, 8, 33]), seed=st.integers(0, 2**16),
       eps=st.sampled_from([1e-6, 1e-5, 0.1]))
def test_rms_norm_gradients_match_numerical_ones(rows: int, width: int, seed: int, eps: float) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, 2, width, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(width, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, eps), (x, w))
    expected = x / torch.sqrt((x * x).sum(-1, keepdim=True) / width + eps) * w
    torch.testing.assert_close(rms_norm(x, w, eps), expected, rtol=1e-12, atol=1e-12)


def test_rms_norm_without_grad_is_the_same_forward() -> None:
    x = torch.randn(3, 8, dtype=torch.float64)
    w = torch.randn(8, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        plain = rms_norm(x, w, 1e-6)
    recorded = rms_norm(x.requires_grad_(), w, 1e-6)
    assert recorded.requires_grad and not plain.requires_grad
    assert torch.equal(plain, recorded.detach())


@settings(max_examples=20, deadline=None)
@given(seq=st.integers(1, 4), heads=st.integers(1, 3), half=st.sampled_from([1, 2, 8]), extra=st.sampled_from([0, 2, 6]),
       seed=st.integers(0, 2**16))
def test_rope_gradients_match_numerical_ones(seq: int, heads: int, half: int, extra: int, seed: int) -> None:
    """``rot = 2 * half`` channels rotate, ``extra`` pass through (a partial rotary dim)."""
    g = torch.Generator().manual_seed(seed)
    t = torch.randn(seq, 2, heads, 2 * half + extra, generator=g, dtype=torch.float64, requires_grad=True)
    freqs = torch.rand(seq, 1, 1, 2 * half, generator=g, dtype=torch.float64) * 6
    assert torch.autograd.gradcheck(lambda a: fused_rope_bshd(a, freqs), (t,))
    x, rest = t[..., :2 * half], t[..., 2 * half:]
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)  # rotate_half, written out
    expected = torch.cat((x * torch.cos(freqs) + rotated * torch.sin(freqs), rest), dim=-1)
    torch.testing.assert_close(fused_rope_bshd(t, freqs), expected, rtol=1e-12, atol=1e-12)


def test_rope_refuses_interleaved_rotation() -> None:
    with pytest.raises(ValueError, match="--no-rope-fusion"):
        fused_rope_bshd(torch.zeros(1, 1, 1, 4), torch.zeros(1, 1, 1, 4), interleaved=True)
