"""Decode-step projections in Triton for `relax.backends.embedded.fused_linear` (imported on CUDA only).

A decode step multiplies a few dozen rows by each weight matrix once, so a projection is a pass
over the weight: what it costs is bytes streamed and kernels launched. One program owns
``BLOCK_N`` output columns for ``BLOCK_M`` rows and streams its ``[BLOCK_N, K]`` slice of the
weight once, whole K, with ``tl.dot`` on the tensor cores; no split-K, so no reduce kernel.
What sits around the GEMM rides along instead of being a kernel of its own:

* ``NORM``: the RMSNorm before it. A first pass over the rows (``BLOCK_M x K``, from L2) sums
  squares in fp32; the main loop normalizes each ``x`` tile in HF's rounding order (fp32
  normalize, cast to the model dtype, times the norm weight in the model dtype) before the dot;
* ``GATED``: the SiLU-gated MLP's gate and up halves (rows ``[0, N)`` and ``[N, 2N)`` of the
  weight), two accumulators, ``silu(gate) * up`` in the epilogue: the ``[M, 2N]`` intermediate
  is never written;
* ``HAS_BIAS`` / ``HAS_RES``: a bias, and the residual add after ``o_proj`` and ``down_proj``.

The epilogue rounds where PyTorch's unfused ops round (each op's result to the model dtype). The
block sizes and pipeline depth are tuned per (N, K, BLOCK_M) by ``triton.autotune`` at the first
call, which the lean runner makes outside graph capture (its warm-up step).

Runs under ``TRITON_INTERPRET=1`` on CPU tensors too (`launch` with a fixed config), which is how
CI tests it without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

MAX_BLOCK_M = 64
_MIN_BLOCK = 16  # tl.dot's smallest tile side


@triton.jit
def _linear_kernel(X, NW, W, B, R, OUT, M, N, K, eps,
                   stride_xm, stride_wn, stride_rm, stride_om,
                   NORM: tl.constexpr, GATED: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rmask = rows < M
    cmask = cols < N
    ks = tl.arange(0, BLOCK_K)
    dtype = OUT.dtype.element_ty
    rstd = tl.zeros([BLOCK_M], tl.float32)
    if NORM:
        squares = tl.zeros([BLOCK_M], tl.float32)
        for k0 in range(0, K, BLOCK_K):
            kk = k0 + ks
            xs = tl.load(X + rows[:, None] * stride_xm + kk[None, :], mask=rmask[:, None] & (kk < K)[None, :],
                         other=0.0).to(tl.float32)
            squares += tl.sum(xs * xs, 1)
        rstd = 1.0 / tl.sqrt(squares / K + eps)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    acc_up = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + ks
        kmask = kk < K
        a = tl.load(X + rows[:, None] * stride_xm + kk[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
        if NORM:
            nw = tl.load(NW + kk, mask=kmask, other=0.0).to(tl.float32)
            a = ((a.to(tl.float32) * rstd[:, None]).to(dtype).to(tl.float32) * nw[None, :]).to(dtype)
        wmask = cmask[:, None] & kmask[None, :]
        w = tl.load(W + cols[:, None] * stride_wn + kk[None, :], mask=wmask, other=0.0)
        acc = tl.dot(a, tl.trans(w), acc)
        if GATED:
            w_up = tl.load(W + (cols + N)[:, None] * stride_wn + kk[None, :], mask=wmask, other=0.0)
            acc_up = tl.dot(a, tl.trans(w_up), acc_up)
    y = acc
    if HAS_BIAS:
        y += tl.load(B + cols, mask=cmask, other=0.0).to(tl.float32)[None, :]
    if GATED:
        gate = y.to(dtype).to(tl.float32)
        y = (gate * tl.sigmoid(gate)).to(dtype).to(tl.float32) * acc_up.to(dtype).to(tl.float32)
    omask = rmask[:, None] & cmask[None, :]
    if HAS_RES:
        res = tl.load(R + rows[:, None] * stride_rm + cols[None, :], mask=omask, other=0.0).to(tl.float32)
        y = res + y.to(dtype).to(tl.float32)
    tl.store(OUT + rows[:, None] * stride_om + cols[None, :], y.to(dtype), mask=omask)


def _configs() -> list[triton.Config]:
    """Column tiles of 16-64, K tiles of 64-256, 2-8 warps, 3-5 stages: the space the H100 sweep
    (ci/bench_fused_linear.py) ranked; configs that overflow shared memory are skipped by the tuner."""
    shapes = [(16, 256, 4, 4), (16, 128, 4, 5), (16, 128, 2, 4), (32, 128, 4, 4), (32, 256, 4, 3),
              (32, 64, 4, 5), (32, 128, 8, 4), (64, 128, 4, 3), (64, 64, 4, 4), (64, 128, 8, 3)]
    return [triton.Config({"BLOCK_N": n, "BLOCK_K": k}, num_warps=w, num_stages=s) for n, k, w, s in shapes]


_tuned_kernel = triton.autotune(configs=_configs(), key=["N", "K", "BLOCK_M", "NORM", "GATED"])(_linear_kernel)


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Half precision, at most `MAX_BLOCK_M` rows (more is a GEMM cuBLAS does well), K a multiple of 16."""
    return (x.dtype in (torch.float16, torch.bfloat16) and weight.dtype == x.dtype and x.dim() == 2
            and x.shape[0] <= MAX_BLOCK_M and x.shape[1] % _MIN_BLOCK == 0 and x.stride(-1) == 1
            and weight.stride(-1) == 1)


def launch(x: torch.Tensor, weight: torch.Tensor, norm_weight: torch.Tensor | None, bias: torch.Tensor | None,
           residual: torch.Tensor | None, eps: float, gated: bool, *, config: dict | None = None) -> torch.Tensor:
    """``[M, N]``: the op's CUDA implementation. ``config`` (``BLOCK_N``, ``BLOCK_K``, ``num_warps``,
    ``num_stages``) bypasses the tuner: for tests under the interpreter and the bench's sweep."""
    m, k = x.shape
    n = weight.shape[0] // (2 if gated else 1)
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if residual is not None and residual.stride(-1) != 1:
        residual = residual.contiguous()
    block_m = max(_MIN_BLOCK, triton.next_power_of_2(min(m, MAX_BLOCK_M)))
    args = (x, out if norm_weight is None else norm_weight, weight, out if bias is None else bias,
            out if residual is None else residual, out, m, n, k, float(eps),
            x.stride(0), weight.stride(0), 0 if residual is None else residual.stride(0), out.stride(0))
    flags = dict(NORM=norm_weight is not None, GATED=gated, HAS_BIAS=bias is not None, HAS_RES=residual is not None,
                 BLOCK_M=block_m)
    if config is None:
        grid = lambda meta: (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, block_m))  # noqa: E731
        _tuned_kernel[grid](*args, **flags)
    else:
        meta = dict(config)
        grid = (triton.cdiv(n, meta["BLOCK_N"]), triton.cdiv(m, block_m))
        _linear_kernel[grid](*args, **flags, **meta)
    return out
