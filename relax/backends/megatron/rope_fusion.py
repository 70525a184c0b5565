"""Fused RoPE for megatron-core without Transformer Engine: one compiled kernel per direction.

Why: megatron-core's unfused RoPE (``rope_utils._apply_rotary_pos_emb_bshd``) runs six full-size
kernels per query or key tensor in the forward (two multiplies, a negate, an add and two ``cat``:
the rotate-half and the re-join of the part that is not rotated) and as many in the backward. At the
GRPO bench's shape (64 x 384 tokens, 16 layers, H100) that is ~10 ms of a 0.15 s train step.

megatron-core runs a fused RoPE when ``TransformerConfig.apply_rope_fusion`` is set, taking the
kernel from Transformer Engine through the module attribute ``rope_utils.fused_apply_rotary_pos_emb``
(None without TE). `install` fills that slot, when it is empty, with `fused_rope_bshd`: the same
formula as megatron's unfused path (``t * cos + rotate_half(t) * sin`` on the first ``rot_dim``
channels, the rest passed through), as one Triton kernel forward, launched directly (forward_kernels.py),
and one backward compiled by ``torch.compile`` (compiled_function.py; the same forward kernel in no-grad
and training passes; the backward is the transposed rotation, ``g * cos + rotate_half^T(g * sin)``).
Both kernels keep the intermediate products in fp32 and round once, where the eager path rounds each bf16 op: values
agree to within one bf16 ulp (tests/gpu/test_megatron_fusions_gpu.py).
Only the bshd layout is filled (relax refuses ``--qkv-format thd``) and only the rotate-half RoPE of the
models relax converts (none sets ``rotary_interleaved``).
"""

from __future__ import annotations

import torch

from relax.backends.megatron.compiled_function import CompiledOnCuda, direct_kernels, records_grad


def _rope_forward(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    rot = freqs.shape[-1]
    x, rest = t[..., :rot], t[..., rot:]
    cos, sin = torch.cos(freqs).to(t.dtype), torch.sin(freqs).to(t.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x * cos + torch.cat((-x2, x1), dim=-1) * sin, rest), dim=-1)


def _rope_backward(grad: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """d/dt of `_rope_forward`: the forward is ``x * cos + R(x) * sin`` with ``R(x) = cat(-x2, x1)``, so the
    gradient is ``g * cos + R^T(g * sin)`` with ``R^T(u) = cat(u2, -u1)``; the rest passes through."""
    rot = freqs.shape[-1]
    g, rest = grad[..., :rot], grad[..., rot:]
    cos, sin = torch.cos(freqs).to(grad.dtype), torch.sin(freqs).to(grad.dtype)
    u1, u2 = (g * sin).chunk(2, dim=-1)
    return torch.cat((g * cos + torch.cat((u2, -u1), dim=-1), rest), dim=-1)


# heads and head_dim static (compiled_function.py): q and k differ in heads only
_FORWARD, _BACKWARD = CompiledOnCuda(_rope_forward, static_trailing=2), CompiledOnCuda(_rope_backward, static_trailing=2)


def _forward(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """The forward kernel of both passes: the direct Triton launch (forward_kernels.py) where it serves, else the
    compiled function."""
    kernels = direct_kernels() if t.is_cuda and freqs.stride(-1) == 1 else None
    if kernels is not None and kernels.takes(t):
        return kernels.rope_forward(t, freqs)
    return _FORWARD(t, freqs)


class _RoPE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(freqs)
        return _forward(t.detach(), freqs.detach())

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        (freqs,) = ctx.saved_tensors
        return _BACKWARD(grad.detach(), freqs.detach()), None


def fused_rope_bshd(t: torch.Tensor, freqs: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """TE's ``fused_apply_rotary_pos_emb(t, freqs, interleaved)`` signature: ``t`` [s, b, h, d], ``freqs``
    [s, 1, 1, rot_dim] (fp32 angles)."""
    if interleaved:
        raise ValueError("relax's fused RoPE has no interleaved rotation (rotary_interleaved); pass --no-rope-fusion")
    if records_grad(t):
        return _RoPE.apply(t, freqs)
    return _forward(t.detach(), freqs.detach())


def install() -> bool:
    """Fill megatron-core's fused-RoPE slot with `fused_rope_bshd` unless Transformer Engine filled it;
    True when ours is the one in the slot."""
    from megatron.core.models.common.embeddings import rope_utils

    if rope_utils.fused_apply_rotary_pos_emb is None:
        rope_utils.fused_apply_rotary_pos_emb = fused_rope_bshd
    return rope_utils.fused_apply_rotary_pos_emb is fused_rope_bshd
