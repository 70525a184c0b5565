"""The trainer's RMSNorm and RoPE forwards as Triton kernels launched directly (imported only where Triton is).

Why: the GRPO bench's RL step on the H100 spends its forward waiting on the host (bench_megatron --profile
--trace at 4e9fe4b, ci/trace_kernels.py: 41.6 ms of forward wall for 25.7 ms of kernels, while the backward kept
the GPU busy: 60.9 ms for 59.8), and a good part of that host time is torch.compile's per-call path (dynamo's
cache lookup, the AOT runtime wrappers) around each of the ~6 compiled norm / RoPE calls of a layer. A Triton launch skips all of it.
The backwards stay compiled (compiled_function.py): the backward is GPU-bound, its launch cost hidden.

The arithmetic is that of norms.py's and rope_fusion.py's compiled forwards, fp32 inside, one rounding to
the input's dtype at the end: RMSNorm ``(x * rsqrt(mean(x^2) + eps)) * w``; RoPE on the first ``rot``
channels ``x * cos + rotate_half(x) * sin``, with ``cos`` and ``sin`` of the fp32 angles rounded to the
input's dtype first (as ``torch.cos(freqs).to(t.dtype)`` is), the rest passed through. The no-grad pass
(old log-probs) and the training forward run the same kernel, so they agree bitwise; against the compiled
forwards they agree to the rounding of the last bit (the fp32 sum's order may differ).

Inputs are any strided tensor whose last dim is contiguous (a q/k split of the fused QKV projection is a
view): each row's offset comes from the leading dims' strides; the outputs are contiguous.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

_TILE = 4096  # elements per program: rows x padded width (a 64-wide q/k row is one of 64 rows in a program)


def takes(t: torch.Tensor) -> bool:
    """Whether the direct kernels serve ``t``: CUDA, at most four dims, the last contiguous, unless
    ``RELAX_TRAIN_DIRECT=0`` (an A/B switch: the compiled forwards then serve every call)."""
    return (t.is_cuda and 1 <= t.dim() <= 4 and t.stride(-1) == 1
            and os.environ.get("RELAX_TRAIN_DIRECT", "1") != "0")


@triton.jit
def _row_offsets(rows, size1, size2, stride0, stride1, stride2):
    """Element offset of each row index over up to three leading dims (sizes of dims 1 and 2, all three strides),
    in int64 (a long sequence's offsets pass 2**31)."""
    rows = rows.to(tl.int64)
    i2 = rows % size2
    rest = rows // size2
    return (rest // size1) * stride0 + (rest % size1) * stride1 + i2 * stride2


@triton.jit
def _rms_norm_kernel(X, W, OUT, n_rows, width, eps, size1, size2, stride0, stride1, stride2,
                     ROWS: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK)
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols[None, :] < width)
    offsets = _row_offsets(rows, size1, size2, stride0, stride1, stride2)
    x = tl.load(X + offsets[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    mean = tl.sum(x * x, 1) / width
    r = tl.rsqrt(mean + eps)
    w = tl.load(W + cols, mask=cols < width, other=0.0).to(tl.float32)
    y = x * r[:, None] * w[None, :]
    out = OUT + rows.to(tl.int64)[:, None] * width + cols[None, :]
    tl.store(out, y.to(OUT.dtype.element_ty), mask=mask)


@triton.jit
def _rope_kernel(T, F, OUT, width, rot, per_pos, size1, size2, stride0, stride1, stride2, f_stride,
                 ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # program (position, chunk): ROWS of the position's per_pos = b * heads rows, whose angles it loads once
    position = tl.program_id(0)
    local = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    rows = position * per_pos + local
    cols = tl.arange(0, BLOCK)
    rotated = cols < rot
    mask = (local < per_pos)[:, None] & (cols[None, :] < width)
    base = _row_offsets(rows, size1, size2, stride0, stride1, stride2)
    x = tl.load(T + base[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)
    half = rot // 2
    partner = tl.where(cols < half, cols + half, cols - half)
    other = tl.load(T + base[:, None] + partner[None, :], mask=mask & rotated[None, :], other=0.0).to(tl.float32)
    other = tl.where((cols < half)[None, :], -other, other)
    angle = tl.load(F + position.to(tl.int64) * f_stride + cols, mask=rotated, other=0.0)
    cos = tl.cos(angle).to(OUT.dtype.element_ty).to(tl.float32)
    sin = tl.sin(angle).to(OUT.dtype.element_ty).to(tl.float32)
    y = tl.where(rotated[None, :], x * cos[None, :] + other * sin[None, :], x)
    out = OUT + rows.to(tl.int64)[:, None] * width + cols[None, :]
    tl.store(out, y.to(OUT.dtype.element_ty), mask=mask)


def _leading(t: torch.Tensor) -> tuple[int, int, int, int, int, int]:
    """(rows, size1, size2, stride0, stride1, stride2) of ``t``'s leading dims (at most three), padded with ones."""
    if t.dim() > 4 or t.dim() < 1 or t.stride(-1) != 1:
        raise ValueError(f"direct kernels take 1-4 dims with a contiguous last dim, got shape {tuple(t.shape)} "
                         f"strides {t.stride()}")
    sizes, strides = [1, 1, 1], [0, 0, 0]
    lead = t.dim() - 1
    sizes[3 - lead:], strides[3 - lead:] = list(t.shape[:-1]), list(t.stride()[:-1])
    rows = sizes[0] * sizes[1] * sizes[2]
    return rows, sizes[1], sizes[2], *strides


def _grid(rows: int, block: int) -> tuple[int, int]:
    per_program = max(1, _TILE // block)
    return per_program, triton.cdiv(rows, per_program)


def rms_norm_forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``norms._rms_forward`` (RMSNorm over the last dim) in one launch; ``x`` any strided CUDA tensor of <= 4 dims."""
    rows, size1, size2, s0, s1, s2 = _leading(x)
    width = x.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    block = triton.next_power_of_2(width)
    per_program, programs = _grid(rows, block)
    if rows:
        _rms_norm_kernel[(programs,)](x, weight, out, rows, width, eps, size1, size2, s0, s1, s2,
                                      ROWS=per_program, BLOCK=block)
    return out


def rope_forward(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """``rope_fusion._rope_forward`` in one launch: ``t`` ``[s, b, h, d]`` (any strides, last dim contiguous),
    ``freqs`` ``[s, 1, 1, rot]`` fp32 angles."""
    if t.dim() != 4 or freqs.dim() != 4 or freqs.shape[0] != t.shape[0] or freqs.shape[1:3] != (1, 1):
        raise ValueError(f"RoPE takes t [s, b, h, d] and freqs [s, 1, 1, rot], got {tuple(t.shape)} and "
                         f"{tuple(freqs.shape)}")
    rot, width = freqs.shape[-1], t.shape[-1]
    if rot % 2 or rot > width or freqs.stride(-1) != 1:
        raise ValueError(f"RoPE needs an even rot <= head_dim {width} over contiguous angles, got {rot}")
    rows, size1, size2, s0, s1, s2 = _leading(t)
    out = torch.empty(t.shape, dtype=t.dtype, device=t.device)
    block = triton.next_power_of_2(width)
    per_pos = size1 * size2  # b * heads rows share a position (and its angles)
    per_program, chunks = _grid(per_pos, block)
    if rows:
        _rope_kernel[(t.shape[0], chunks)](t, freqs, out, width, rot, per_pos, size1, size2, s0, s1, s2,
                                           freqs.stride(0), ROWS=per_program, BLOCK=block)
    return out
