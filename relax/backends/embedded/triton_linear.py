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
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from relax.backends.embedded.pdl import pdl_available
from relax.backends.embedded.sm_count import sm_count

BLOCK_M = 64
BLOCK_K = 128
MAX_ROWS = 64  # above this the GEMMs are not launch-bound and cuBLAS is used (the caller's F.linear)
SPLIT_BLOCK_N = 64  # the column tile of a split-K launch
MAX_TILES = 1024  # column tiles a split-K launch may have (its counters)
_COUNTERS: dict[torch.device, torch.Tensor] = {}


@triton.jit
def _finish(acc, up, B, OUT, rm, rn, m_in, stride_om, HAS_BIAS: tl.constexpr, GLU: tl.constexpr):
    """Bias, rounding to the output dtype, ``silu(gate) * up`` with ``GLU``, and the store of one output tile."""
    if HAS_BIAS:
        acc += tl.load(B + rn)[None, :].to(tl.float32)
    out = acc.to(OUT.dtype.element_ty)
    if GLU:  # silu(gate) * up of the two projections as the model dtype rounds them, in fp32, rounded once
        gate = out.to(tl.float32)
        out = (gate * tl.sigmoid(gate) * up.to(OUT.dtype.element_ty).to(tl.float32)).to(OUT.dtype.element_ty)
    tl.store(OUT + rm[:, None] * stride_om + rn[None, :], out, mask=m_in)


@triton.jit
def _skinny_kernel(X, W, B, OUT, PART, COUNT, M, stride_xm, stride_wn, stride_om, K: tl.constexpr,
                   HAS_BIAS: tl.constexpr, GLU: tl.constexpr, N_OUT: tl.constexpr, SPLITS: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)  # the K split (SPLITS > 1, one row block) or the row block (SPLITS == 1)
    if SPLITS == 1:
        rm = pid_s * BLOCK_M + tl.arange(0, BLOCK_M)
        k_lo = 0
    else:
        rm = tl.arange(0, BLOCK_M)
        k_lo = pid_s * (K // SPLITS)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    m_in = rm[:, None] < M
    if PDL:  # the previous grid is complete (its writes visible) past this point; let the next one launch
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(k_lo, k_lo + K // SPLITS, BLOCK_K):
        x = tl.load(X + rm[:, None] * stride_xm + (k0 + rk)[None, :], mask=m_in, other=0.0)
        w = tl.load(W + rn[:, None] * stride_wn + (k0 + rk)[None, :])
        acc += tl.dot(x, tl.trans(w))
        if GLU:  # the same columns of the up half of the weight (rows N_OUT + rn)
            w_up = tl.load(W + (N_OUT + rn)[:, None] * stride_wn + (k0 + rk)[None, :])
            up += tl.dot(x, tl.trans(w_up))
    if SPLITS == 1:
        _finish(acc, up, B, OUT, rm, rn, m_in, stride_om, HAS_BIAS, GLU)
    else:
        # this split's fp32 partial tile into the workspace ([split, tile, BLOCK_M, BLOCK_N], the up half's after
        # all the gate half's), then count it in; the program that counts last sums every split in split order
        # (the same sum whichever program that is) and finishes the tile, and puts its counter back to 0 for the
        # next launch (which waits for this grid's completion under PDL, and starts after it without)
        tiles = tl.num_programs(0)
        tile = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
        tl.store(PART + (pid_s * tiles + pid_n) * BLOCK_M * BLOCK_N + tile, acc)
        if GLU:
            tl.store(PART + ((SPLITS + pid_s) * tiles + pid_n) * BLOCK_M * BLOCK_N + tile, up)
        tl.debug_barrier()  # every thread's partial is stored before the count (release) publishes them
        if tl.atomic_add(COUNT + pid_n, 1, sem="acq_rel") == SPLITS - 1:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLITS):
                acc += tl.load(PART + (s * tiles + pid_n) * BLOCK_M * BLOCK_N + tile, cache_modifier=".cg")
                if GLU:
                    up += tl.load(PART + ((SPLITS + s) * tiles + pid_n) * BLOCK_M * BLOCK_N + tile,
                                  cache_modifier=".cg")
            tl.atomic_xchg(COUNT + pid_n, 0)
            _finish(acc, up, B, OUT, rm, rn, m_in, stride_om, HAS_BIAS, GLU)


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


def plan(m: int, n: int, k: int, sms: int) -> tuple[int, int]:
    """(column tile, K splits) for ``m`` rows of an ``[n, k]`` projection (``n``: output columns, each half's with
    ``glu``). Split-K where the rows fit one row block and 64-column tiles divide ``n``: 64 columns a program (the
    activation it re-reads from L2 per weight byte is a quarter of a 16-column tile's) and the K range split in
    the most powers of two that still leave every program an SM of its own; else one split of `block_n`'s tile."""
    if m <= BLOCK_M and n % SPLIT_BLOCK_N == 0:
        tiles, blocks, splits = n // SPLIT_BLOCK_N, k // BLOCK_K, 1
        while blocks % (2 * splits) == 0 and tiles * 2 * splits <= min(sms, MAX_TILES):
            splits *= 2
        if splits > 1:
            return SPLIT_BLOCK_N, splits
    return block_n(n, sms), 1


def _counters(device: torch.device) -> torch.Tensor:
    """The split-K tile counters of ``device``: zeros that each launch counts up and its last programs put back."""
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(MAX_TILES, dtype=torch.int32, device=device)
    return _COUNTERS[device]


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *, glu: bool = False,
                  pdl: bool | None = None, num_warps: int = 4, num_stages: int = 4,
                  tile: tuple[int, int] | None = None) -> torch.Tensor:
    """``x [M, K] @ weight[N, K].T (+ bias)``; with ``glu`` (the MLP's fused gate/up weight, ``[2I, K]``, no bias)
    ``silu(gate) * up`` of its two halves, ``[M, I]``, as ``F.silu(gate) * up`` of the two projections rounds it.
    The caller checks `supports` first. ``pdl`` defaults to `pdl_available` on ``x``'s device; ``tile`` (column
    tile, K splits) to `plan`'s (ci/bench_decode_linear.py tries others; ``RELAX_DECODE_SPLITK=0`` in the
    environment: one split, `block_n`'s tile, an A/B)."""
    m, k = x.shape
    if glu and bias is not None:
        raise ValueError("skinny_linear: glu takes no bias (the MLP's gate/up projections have none)")
    n = weight.shape[0] // 2 if glu else weight.shape[0]
    sms = sm_count(x.device)
    bn, splits = tile or (plan(m, n, k, sms) if os.environ.get("RELAX_DECODE_SPLITK", "1") != "0" else (block_n(n, sms), 1))
    use_pdl = pdl_available(x.device) if pdl is None else pdl
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    launch = {"launch_pdl": True} if use_pdl else {}
    if splits > 1:
        part = torch.empty((2 if glu else 1) * splits * n * BLOCK_M, dtype=torch.float32, device=x.device)
        count = _counters(x.device)
    else:
        part = count = out  # unused by the one-split kernel
    _skinny_kernel[(n // bn, splits if splits > 1 else triton.cdiv(m, BLOCK_M))](
        x, weight, bias if bias is not None else out, out, part, count, m, x.stride(0), weight.stride(0),
        out.stride(0), K=k, HAS_BIAS=bias is not None, GLU=glu, N_OUT=n, SPLITS=splits, BLOCK_M=BLOCK_M,
        BLOCK_N=bn, BLOCK_K=BLOCK_K, PDL=use_pdl, num_warps=num_warps, num_stages=num_stages, **launch)
    return out
