"""Skinny GEMM in Triton for the decode projections (``y = x @ w.T + b`` with few rows of ``x``).

Why: at decode time the lean runner's projections are GEMMs with M = the batch (64 rows) and
weights of 2-12 MB. cuBLAS picks tiles for them that leave most of the H100 idle (64 or fewer
thread blocks for a 4 MB weight) or adds a split-K reduce kernel: on bench-270m the four
projections of a layer read their 24 MB at ~1.0 TB/s, 31% of HBM (docs/performance.md). What such
a GEMM needs is every SM streaming its own slice of the weight at once: this kernel's grid is
``(N / BLOCK_N, SPLIT_K, ceil(M / BLOCK_M))``, each program reads one ``BLOCK_N x K / SPLIT_K``
slice of ``w`` once (and the matching columns of the small ``x``, from L2), and with ``SPLIT_K``
> 1 the partial sums meet in the same kernel: each program stores its fp32 partial tile, takes a
ticket from a per-tile counter, and the program that draws the last ticket adds the ``SPLIT_K``
partials in a fixed order (so the result does not depend on which program finished first:
deterministic, unlike atomic adds), adds the bias, rounds once to the output dtype, and puts the
counter back to zero for the next call (no memset kernel, CUDA-graph safe).

Accumulation is fp32, as cuBLAS's; only the order of the K-sum differs. Runs under
``TRITON_INTERPRET=1`` on CPU tensors, which is how CI checks it without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@triton.jit
def _skinny_kernel(X, W, B, OUT, PART, TICKETS, M, N, K, stride_xm, stride_wn, stride_om,
                   HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    k_len = K // SPLIT_K  # the host checks K % (SPLIT_K * BLOCK_K) == 0 and N % BLOCK_N == 0
    k0 = pid_k * k_len
    m_in = rm[:, None] < M
    x_ptrs = X + rm[:, None] * stride_xm + (k0 + rk)[None, :]
    w_ptrs = W + rn[:, None] * stride_wn + (k0 + rk)[None, :]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for _ in range(0, k_len, BLOCK_K):
        x = tl.load(x_ptrs, mask=m_in, other=0.0)
        w = tl.load(w_ptrs)
        acc += tl.dot(x, tl.trans(w))
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    out_ptrs = OUT + rm[:, None] * stride_om + rn[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(B + rn)[None, :].to(tl.float32)
        tl.store(out_ptrs, acc.to(OUT.dtype.element_ty), mask=m_in)
    else:
        rows = tl.num_programs(2) * BLOCK_M  # PART is [SPLIT_K, rows, N]
        tile = PART + rm[:, None] * N + rn[None, :]
        tl.store(tile + pid_k * rows * N, acc)
        tl.debug_barrier()  # every thread's partial is written before the ticket is drawn
        ticket = TICKETS + pid_m * tl.num_programs(0) + pid_n
        if tl.atomic_add(ticket, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):  # a fixed order: the same sum whoever finished last
                total += tl.load(tile + s * rows * N, cache_modifier=".cg")
            if HAS_BIAS:
                total += tl.load(B + rn)[None, :].to(tl.float32)
            tl.store(out_ptrs, total.to(OUT.dtype.element_ty), mask=m_in)
            tl.atomic_xchg(ticket, 0)


@dataclass(frozen=True)
class SkinnyConfig:
    """One launch shape: tile sizes, K split and Triton's warps / pipeline stages."""

    block_m: int = 64
    block_n: int = 64
    block_k: int = 128
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3

    def fits(self, n: int, k: int) -> bool:
        return n % self.block_n == 0 and k % (self.split_k * self.block_k) == 0


_TICKETS: dict[torch.device, torch.Tensor] = {}
_MAX_TILES = 1 << 14


def _tickets(device: torch.device) -> torch.Tensor:
    """The per-device tile counters (zero between calls: the last program of each tile resets its own).
    Allocated on first use, which the lean runner's warm-up makes happen before any graph capture."""
    t = _TICKETS.get(device)
    if t is None:
        t = _TICKETS[device] = torch.zeros(_MAX_TILES, dtype=torch.int32, device=device)
    return t


def choose_config(m: int, n: int, k: int, sms: int) -> SkinnyConfig | None:
    """A config that gives every SM a slice of the weight (about one program per SM or more), or None when
    the shape does not tile (the caller uses ``F.linear``). Fixed rules, not autotuning, so the sum order
    (and the sampled tokens) is the same in every process."""
    block_m = 64 if m > 16 else 16
    m_blocks = -(-m // block_m)
    for block_n in (64, 32, 16):
        if n % block_n:
            continue
        tiles = (n // block_n) * m_blocks
        split = 1
        while tiles * split < sms and split < 16 and k % (2 * split * 64) == 0:
            split *= 2
        block_k = 128 if k % (split * 128) == 0 and k // split >= 128 else 64
        cfg = SkinnyConfig(block_m=block_m, block_n=block_n, block_k=block_k, split_k=split)
        if cfg.fits(n, k) and tiles * split >= sms // 2:
            return cfg
    return None


def skinny_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
                  config: SkinnyConfig | None = None) -> torch.Tensor | None:
    """``x [M, K] @ weight[N, K].T (+ bias)``; None when no config tiles the shape (the caller falls back)."""
    m, k = x.shape
    n = weight.shape[0]
    if config is None:
        sms = torch.cuda.get_device_properties(x.device).multi_processor_count if x.is_cuda else 132
        config = choose_config(m, n, k, sms)
    if config is None or not config.fits(n, k) or x.stride(1) != 1 or weight.stride(1) != 1:
        return None
    m_blocks = -(-m // config.block_m)
    grid = (n // config.block_n, config.split_k, m_blocks)
    if grid[0] * grid[2] > _MAX_TILES:
        return None
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if config.split_k > 1:
        part = torch.empty((config.split_k, m_blocks * config.block_m, n), dtype=torch.float32, device=x.device)
        tickets = _tickets(x.device)
    else:
        part = tickets = out  # unused
    _skinny_kernel[grid](x, weight, bias if bias is not None else out, out, part, tickets, m, n, k,
                         x.stride(0), weight.stride(0), out.stride(0),
                         HAS_BIAS=bias is not None, BLOCK_M=config.block_m, BLOCK_N=config.block_n,
                         BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                         num_warps=config.num_warps, num_stages=config.num_stages)
    return out
