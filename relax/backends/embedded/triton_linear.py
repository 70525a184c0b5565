"""Skinny GEMM in Triton for the decode projections, launched with programmatic dependent launch (PDL).

Why: at decode time the lean runner's projections are GEMMs with M = the batch (<= 64 rows) and
weights of 2-12 MB. Each takes 4-8 us however it is tiled (cuBLAS or Triton, ci/bench_decode_linear.py
in git history, docs/performance.md): what bounds them is each kernel's fixed cost (launch, the first
loads' latency, the tail), not the tiles. On Hopper a kernel launched with PDL may start while the
kernel before it in the stream is still running: its programs become resident, then wait in
``gdc_wait`` until the previous grid has completed and its writes are visible, so the launch and the
ramp overlap the previous kernel's tail. `ci/bench_decode_linear.py` times bench-270m's four projections
of 16 layers chained as one CUDA graph (M = 64) against cuBLAS, with and without PDL (figures in
docs/performance.md). The chain gains most when its neighbours are PDL kernels too (the lean runner's
compiled decode forward uses inductor's PDL codegen and its attention kernel is launched with PDL); in the
decode step the kernel without PDL was slower than cuBLAS.

The kernel: grid ``(N / BLOCK_N, ceil(M / BLOCK_M))``; each program owns ``BLOCK_N`` output columns, reads
its ``BLOCK_N x K`` slice of the weight once and the matching rows of the small ``x`` (from L2), and
accumulates in fp32 (as cuBLAS), then adds the bias and rounds once. With PDL it waits for the previous
grid before its first load and lets the next grid launch right after (the next one waits for this grid's
completion in turn, so no write is read early). Runs under ``TRITON_INTERPRET=1`` on CPU tensors without
PDL, which is how CI checks it without a GPU.

Split-K (`skinny_partials`, grid ``(N / 32, splits)``): where ``N / 16`` programs leave SMs idle (bench-270m's o and
down projections, N = 1024: 64 programs on the H100's 132 SMs), each program takes a K range of a 32-column tile
and writes its fp32 partial sums; the caller adds them (in split order, rounding once) inside the fused kernel that
consumes the projection. Each program then re-reads only its K slice of the activation from L2. On the H100 alone
(`ci/bench_decode_linear.py --sweep --grid ... splits=1,2,4,8`) down took 4.42 us in 4 splits against 8.45 us, o
2.70 against 3.37; in the decode step +5.5% tok/s (docs/performance.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from relax.backends.embedded.pdl import pdl_available
from relax.backends.embedded.sm_count import sm_count

BLOCK_M = 64
BLOCK_K = 128
MAX_ROWS = 64  # above this the GEMMs are not launch-bound and cuBLAS is used (the caller's F.linear)
SPLIT_BLOCK_N = 32  # the column tile of a split-K launch (`skinny_partials`)


@triton.jit
def _skinny_kernel(X, W, B, OUT, M, stride_xm, stride_wn, stride_om, stride_os, K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, GLU: tl.constexpr, N_OUT: tl.constexpr, SPLITS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid = tl.program_id(1)  # the row block, or with SPLITS > 1 (one row block) the K split
    if SPLITS == 1:
        rm = pid * BLOCK_M + tl.arange(0, BLOCK_M)
        k_lo = 0
    else:
        rm = tl.arange(0, BLOCK_M)
        k_lo = pid * (K // SPLITS)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_in = rm[:, None] < M
    if PDL:  # the previous grid is complete (its writes visible) past this point; let the next one launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K // SPLITS, BLOCK_K):  # constant bounds (Triton 3.6's interpreter takes no others here)
        x = tl.load(X + rm[:, None] * stride_xm + (k_lo + k0 + rk)[None, :], mask=m_in, other=0.0)
        w = tl.load(W + rn[:, None] * stride_wn + (k_lo + k0 + rk)[None, :])
        acc += tl.dot(x, tl.trans(w))
        if GLU:  # the same columns of the up half of the weight (rows N_OUT + rn)
            w_up = tl.load(W + (N_OUT + rn)[:, None] * stride_wn + (k_lo + k0 + rk)[None, :])
            up += tl.dot(x, tl.trans(w_up))
    if HAS_BIAS:  # once: in the first split's partial
        bias = tl.load(B + rn).to(tl.float32)
        if SPLITS == 1:
            acc += bias[None, :]
        else:
            acc += tl.where(pid == 0, bias, 0.0)[None, :]
    out = acc.to(OUT.dtype.element_ty)  # with SPLITS > 1 OUT holds fp32 partials (stride_os apart): no rounding
    if GLU:  # silu(gate) * up of the two projections as the model dtype rounds them, in fp32, rounded once
        gate = out.to(tl.float32)
        out = (gate * tl.sigmoid(gate) * up.to(OUT.dtype.element_ty).to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + pid * stride_os + rm[:, None] * stride_om + rn[None, :], out, mask=m_in)


def block_n(n: int, sms: int) -> int | None:
    """The widest column tile (64, 32 or 16) that still gives about half the SMs a program, else the narrowest
    that tiles ``n``; None when none does. Measured on the H100 at M = 64: q/k/v (N 2048) 32, o and down
    (N 1024) 16, gate/up (N 6144) 64."""
    fitting = [b for b in (64, 32, 16) if n % b == 0]
    for b in fitting:
        if n // b >= sms // 2:
            return b
    return fitting[-1] if fitting else None


def supports(x: torch.Tensor, weight: torch.Tensor, *, glu: bool = False) -> bool:
    """2-D half-precision ``x`` of at most `MAX_ROWS` rows and a weight `tiles` takes, of ``x``'s K and dtype."""
    return (x.dim() == 2 and 0 < x.shape[0] <= MAX_ROWS and x.dtype in (torch.float16, torch.bfloat16)
            and weight.dtype == x.dtype and tiles(weight, glu=glu) and weight.shape[1] == x.shape[1]
            and x.stride(1) == 1)


def tiles(weight: torch.Tensor, *, glu: bool = False) -> bool:
    """A row-major 2-D weight whose K is a multiple of `BLOCK_K` and whose N (with ``glu``: each of its two halves)
    some column tile divides."""
    if weight.dim() != 2 or weight.stride(1) != 1 or weight.shape[1] % BLOCK_K or (glu and weight.shape[0] % 2):
        return False
    return (weight.shape[0] // 2 if glu else weight.shape[0]) % 16 == 0


@dataclass(frozen=True)
class Tile:
    """A launch config of the skinny kernel: a program's rows, columns and K step, its warps and pipeline stages."""

    block_m: int
    block_n: int
    block_k: int = BLOCK_K
    warps: int = 4
    stages: int = 4


def default_tile(n: int, sms: int) -> Tile:
    """`BLOCK_M` rows, `block_n`'s columns, `BLOCK_K`, 4 warps, 4 stages: what the lean runner launches."""
    return Tile(BLOCK_M, block_n(n, sms))


def split_count(n: int, k: int, sms: int) -> int:
    """K splits for `skinny_partials` through an ``[n, k]`` weight (any rows up to `BLOCK_M`): the most of 2, 4 or 8
    that divide K into whole `BLOCK_K` steps and still leave every program (``n / SPLIT_BLOCK_N`` column tiles per
    split) an SM of its own; 1 where none does (then the plain kernel). Why 32-column tiles: a program re-reads its
    rows of the activation from L2 once per column tile, so 16-column tiles (the plain kernel's at N = 1024) read
    four times the activation's bytes per weight byte, 32-column ones twice."""
    if n % SPLIT_BLOCK_N or k % BLOCK_K:
        return 1
    splits = 1
    while splits < 8 and k % (2 * splits * BLOCK_K) == 0 and n // SPLIT_BLOCK_N * 2 * splits <= sms:
        splits *= 2
    return splits


def skinny_partials(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, splits: int, *,
                    pdl: bool | None = None, tile: Tile | None = None) -> torch.Tensor:
    """Split-K ``x [M, K] @ weight[N, K].T (+ bias)`` as fp32 partial sums ``[splits, M, N]`` over consecutive K
    ranges (the bias in the first), which the caller adds in split order and rounds once. Why: where N / 16
    programs leave SMs idle (o and down of bench-270m: 64 programs on 132 SMs), programs that each take a K range
    fill them, and each re-reads only its slice of the activation; the caller's next fused kernel (the residual
    add) takes the sum in, so the split costs no kernel of its own. The caller checks `supports` first; ``tile``
    defaults to `BLOCK_M` rows and `SPLIT_BLOCK_N` columns (one row block: ``M <= tile.block_m``)."""
    m, k = x.shape
    n = weight.shape[0]
    tile = tile or Tile(BLOCK_M, SPLIT_BLOCK_N)
    if m > tile.block_m or k % (splits * tile.block_k) or n % tile.block_n:
        raise ValueError(f"skinny_partials: {m} rows, N {n}, K {k} do not take {splits} splits of {tile}")
    use_pdl = pdl_available(x.device) if pdl is None else pdl
    out = torch.empty((splits, m, n), dtype=torch.float32, device=x.device)
    launch = {"launch_pdl": True} if use_pdl else {}
    _skinny_kernel[(n // tile.block_n, splits)](
        x, weight, bias if bias is not None else out, out, m, x.stride(0), weight.stride(0), out.stride(1),
        out.stride(0), K=k, HAS_BIAS=bias is not None, GLU=False, N_OUT=n, SPLITS=splits, BLOCK_M=tile.block_m,
        BLOCK_N=tile.block_n, BLOCK_K=tile.block_k, PDL=use_pdl, num_warps=tile.warps, num_stages=tile.stages,
        **launch)
    return out


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, glu: bool = False,
                  pdl: bool | None = None, tile: Tile | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T (+ bias)``; with ``glu`` (the MLP's fused gate/up weight, ``[2I, K]``, no bias)
    ``silu(gate) * up`` of its two halves, ``[M, I]``, as ``F.silu(gate) * up`` of the two projections rounds it.
    The caller checks `supports` first. ``pdl`` defaults to `pdl_available` on ``x``'s device, ``tile`` to
    `default_tile` (ci/bench_decode_linear.py ``--sweep`` tries others; the tile must divide N and K)."""
    m, k = x.shape
    if glu and bias is not None:
        raise ValueError("skinny_linear: glu takes no bias (the MLP's gate/up projections have none)")
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    tile = tile or default_tile(n, sm_count(x.device))
    use_pdl = pdl_available(x.device) if pdl is None else pdl
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    launch = {"launch_pdl": True} if use_pdl else {}
    _skinny_kernel[(n // tile.block_n, triton.cdiv(m, tile.block_m))](
        x, weight, bias if bias is not None else out, out, m, x.stride(0), weight.stride(0), out.stride(0), 0,
        K=k, HAS_BIAS=bias is not None, GLU=glu, N_OUT=n, SPLITS=1, BLOCK_M=tile.block_m, BLOCK_N=tile.block_n,
        BLOCK_K=tile.block_k, PDL=use_pdl, num_warps=tile.warps, num_stages=tile.stages, **launch)
    return out
