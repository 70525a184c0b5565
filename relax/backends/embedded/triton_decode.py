"""Flash-decoding attention in Triton for `relax.backends.embedded.decode_attention` (imported on CUDA only).

Grid ``(rows, kv_heads, splits)``. A program loads the ``group`` query heads that share its KV
head (padded to 16 rows for ``tl.dot``), streams the row's cache positions ``[0, position)`` of
its split in blocks of ``BLOCK_N`` with an online softmax in fp32 (scores never round to the
model dtype, unlike the ``baddbmm`` reference), and adds the new token from registers: the last
split writes the new K/V into the cache and is the only one that attends to it, so no program
reads a position another one writes. With one split the program normalizes and stores the output;
with several (few rows, long contexts: too few programs to fill the GPU) each stores its partial
output and log-sum-exp, and `_combine_kernel` merges them.

Shared prompts (``HAS_PREFIX``): a row may read its first ``prefix_lens[b]`` positions from another
slot, ``prefix_rows[b]``, the row that holds a prompt they share (the lean runner's prompt sharing:
GRPO's n completions of one prompt keep its K/V once, and the programs of a group read the same
bytes, mostly from L2). Each key/value row of a block picks its slot by position, so a block may
straddle the prefix's end.

On Hopper and newer it is launched with programmatic dependent launch (`relax.backends.embedded.pdl`), and
loads what no kernel of the step writes before it waits for the previous grid (``EARLY``): the row's position,
its prompt source, its first block of cache positions (``RELAX_DECODE_EARLY=0`` loads them after the wait), and
with RoPE the q/k-norm weights and the position's RoPE rows; the new token's K/V come in the queries' round trip
(``HOIST``; ``RELAX_DECODE_HOIST=0`` loads those apart, after the wait: -3% tok/s on the H100, docs/performance.md).

Runs under ``TRITON_INTERPRET=1`` on CPU tensors too (without PDL), which is how CI tests it without a GPU.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from relax.backends.embedded.pdl import pdl_available
from relax.backends.embedded.sm_count import sm_count

BLOCK_N = 64
_MIN_GROUP_ROWS = 16  # tl.dot's smallest M


@triton.jit
def _norm_weights(NORM_W, d, QK_NORM: tl.constexpr, DIM: tl.constexpr):
    """A q/k-norm weight as fp32 ``[1, DIM]`` at the head dim's offsets and at the rolled ones (ones without
    ``QK_NORM``): no kernel writes it, so a caller may load it before ``gdc_wait``."""
    rolled = (d + DIM // 2) % DIM
    if QK_NORM:
        w = tl.load(NORM_W + d).to(tl.float32)[None, :]
        wr = tl.load(NORM_W + rolled).to(tl.float32)[None, :]
    else:
        w = tl.full([1, DIM], 1.0, tl.float32)
        wr = tl.full([1, DIM], 1.0, tl.float32)
    return w, wr


@triton.jit
def _rope_rows(COS_ROW, SIN_ROW, d):
    """A position's RoPE table rows as fp32 ``[1, DIM]`` (constant tables: loadable before ``gdc_wait``)."""
    return tl.load(COS_ROW + d).to(tl.float32)[None, :], tl.load(SIN_ROW + d).to(tl.float32)[None, :]


@triton.jit
def _norm_rope(ptrs, d, mask, w, wr, cos, sin, eps, QK_NORM: tl.constexpr, DIM: tl.constexpr):
    """Raw heads at ``ptrs`` (``[rows, 1]`` or a scalar pointer; ``d`` the head dim's offsets) through q/k-norm (with
    ``QK_NORM``; ``w`` / ``wr`` from `_norm_weights`) and RoPE (``cos`` / ``sin`` from `_rope_rows`), rounded to the
    model dtype where HF's eager modules round (`decode_attention.prepare_qk`): ``[rows, DIM]`` fp32 of the last
    sum, which the caller rounds. The rotated half is read again at the rolled offsets rather than moved in
    registers."""
    dt = ptrs.dtype.element_ty
    rolled = (d + DIM // 2) % DIM
    x = tl.load(ptrs + d[None, :], mask=mask, other=0.0).to(tl.float32)
    xr = tl.load(ptrs + rolled[None, :], mask=mask, other=0.0).to(tl.float32)
    if QK_NORM:  # one scale per head for both reads: RMSNorm in fp32, rounded, times the weight, rounded
        rstd = tl.math.rsqrt(tl.sum(x * x, 1) / DIM + eps)
        x = ((x * rstd[:, None]).to(dt).to(tl.float32) * w).to(dt)
        xr = ((xr * rstd[:, None]).to(dt).to(tl.float32) * wr).to(dt)
    return (x.to(tl.float32) * cos).to(dt).to(tl.float32) + (xr.to(tl.float32) * sin).to(dt).to(tl.float32)


@triton.jit
def _attend_block(q, k, v, nmask, m, denom, acc, scale):
    """One block of cache positions into the online softmax: ``(m, denom, acc)`` updated with keys ``k`` and values
    ``v`` (``[BLOCK_N, DIM]``); positions outside ``nmask`` weigh nothing, and a block without any (the first
    block of an empty split, of a padding row) leaves the state as it was."""
    scores = tl.dot(q, tl.trans(k)) * scale
    scores = tl.where(nmask[None, :], scores, float("-inf"))
    m_new = tl.maximum(m, tl.max(scores, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # no score yet: exp(-inf - 0) = 0, not exp(nan)
    alpha = tl.exp(m - m_safe)
    p = tl.exp(scores - m_safe[:, None])
    denom = denom * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
    return m_new, denom, acc


@triton.jit
def _load_block(KC, VC, b, h, offs, end, d, shared_row, shared_len, stride_kcb, stride_kch, stride_kct, stride_vcb,
                stride_vch, stride_vct, HAS_PREFIX: tl.constexpr):
    """K and V (``[BLOCK_N, DIM]``, zero past ``end``) of cache positions ``offs`` of row ``b``, KV head ``h``, and the
    positions' mask: with ``HAS_PREFIX`` those before the shared prompt's end from the slot that holds it."""
    mask = offs < end
    if HAS_PREFIX:
        row = tl.where(offs < shared_len, shared_row, b).to(tl.int64)
        k_rows = (KC + row * stride_kcb + h * stride_kch)[:, None]
        v_rows = (VC + row * stride_vcb + h * stride_vch)[:, None]
    else:  # one base pointer (scalar: the loads' contiguity stays plain to the compiler)
        k_rows = KC + b * stride_kcb + h * stride_kch
        v_rows = VC + b * stride_vcb + h * stride_vch
    k = tl.load(k_rows + offs[:, None] * stride_kct + d[None, :], mask=mask[:, None], other=0.0)
    v = tl.load(v_rows + offs[:, None] * stride_vct + d[None, :], mask=mask[:, None], other=0.0)
    return k, v, mask


@triton.jit
def _new_kv(QK, VN, b, h, d, k_w, k_wr, cos, sin, stride_qb, stride_qh, stride_vnb, stride_vnh, eps,
            HEADS: tl.constexpr, ROPE: tl.constexpr, QK_NORM: tl.constexpr, DIM: tl.constexpr):
    """The new token's key (through k-norm and RoPE with ``ROPE``) and value for KV head ``h``, ``[DIM]`` each."""
    if ROPE:
        kn = tl.reshape(_norm_rope(QK + b * stride_qb + (HEADS + h) * stride_qh, d, d[None, :] < DIM, k_w, k_wr, cos,
                                   sin, eps, QK_NORM, DIM), (DIM,)).to(QK.dtype.element_ty)
    else:
        kn = tl.load(QK + b * stride_qb + (HEADS + h) * stride_qh + d)
    vn = tl.load(VN + b * stride_vnb + h * stride_vnh + d)
    return kn, vn


@triton.jit
def _decode_kernel(QK, VN, KC, VC, POS, PREFIX_ROWS, PREFIX_LENS, OUT, PO, PL, COS, SIN, QN, KN,
                   stride_qb, stride_qh, stride_vnb, stride_vnh,
                   stride_kcb, stride_kch, stride_kct, stride_vcb, stride_vch, stride_vct,
                   stride_ob, stride_oh, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, stride_rope,
                   scale, chunk, eps,
                   HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, DIM: tl.constexpr, BLOCK_N: tl.constexpr,
                   SPLITS: tl.constexpr, HAS_PREFIX: tl.constexpr, ROPE: tl.constexpr, QK_NORM: tl.constexpr,
                   PDL: tl.constexpr, EARLY: tl.constexpr, HOIST: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    s = tl.program_id(2)
    if PDL and not EARLY:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    # With EARLY, before the wait (PDL), what no kernel of this step writes: the row's position and prompt source
    # (written before the step), and its first block of cache positions (written by earlier steps; this step's new
    # K/V goes to `pos`, past every position read here); their latency then overlaps the previous kernel's tail
    pos = tl.load(POS + b)
    g = tl.arange(0, BLOCK_G)
    d = tl.arange(0, DIM)
    heads = h * GROUP + g
    gmask = g < GROUP
    if HAS_PREFIX:
        shared_row = tl.load(PREFIX_ROWS + b)
        shared_len = tl.load(PREFIX_LENS + b)
    else:
        shared_row = b
        shared_len = 0
    start = s * chunk
    end = tl.minimum(start + chunk, pos)
    k_first, v_first, first = _load_block(KC, VC, b, h, start + tl.arange(0, BLOCK_N), end, d, shared_row, shared_len,
                                          stride_kcb, stride_kch, stride_kct, stride_vcb, stride_vch, stride_vct,
                                          HAS_PREFIX)
    if ROPE and HOIST:  # the norm weights and the position's RoPE rows: constant, so with EARLY before the wait too
        q_w, q_wr = _norm_weights(QN, d, QK_NORM, DIM)
        k_w, k_wr = _norm_weights(KN, d, QK_NORM, DIM)
        cos, sin = _rope_rows(COS + pos * stride_rope, SIN + pos * stride_rope, d)
    if PDL and EARLY:  # relax.backends.embedded.pdl: wait for the previous grid before loading what it wrote, then
        tl.extra.cuda.gdc_wait()  # let the next one launch
        tl.extra.cuda.gdc_launch_dependents()
    if ROPE:  # raw projection in: this program's query heads through q-norm and RoPE here (`_norm_rope`)
        if not HOIST:
            q_w, q_wr = _norm_weights(QN, d, QK_NORM, DIM)
            cos, sin = _rope_rows(COS + pos * stride_rope, SIN + pos * stride_rope, d)
        q = _norm_rope(QK + b * stride_qb + heads[:, None] * stride_qh, d, gmask[:, None], q_w, q_wr, cos, sin, eps,
                       QK_NORM, DIM).to(QK.dtype.element_ty)
    else:
        q = tl.load(QK + b * stride_qb + heads[:, None] * stride_qh + d[None, :], mask=gmask[:, None], other=0.0)
        k_w, k_wr, cos, sin = 1.0, 1.0, 1.0, 1.0  # unused without ROPE
    if HOIST:  # the new token's K/V in the queries' round trip (every split loads them; the last one uses them)
        kn, vn = _new_kv(QK, VN, b, h, d, k_w, k_wr, cos, sin, stride_qb, stride_qh, stride_vnb, stride_vnh, eps, HEADS,
                         ROPE, QK_NORM, DIM)
    k_base = KC + b * stride_kcb + h * stride_kch
    v_base = VC + b * stride_vcb + h * stride_vch

    m = tl.full([BLOCK_G], float("-inf"), tl.float32)
    denom = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, DIM], tl.float32)
    m, denom, acc = _attend_block(q, k_first, v_first, first, m, denom, acc, scale)
    for n0 in range(start + BLOCK_N, end, BLOCK_N):  # the rest
        k, v, nmask = _load_block(KC, VC, b, h, n0 + tl.arange(0, BLOCK_N), end, d, shared_row, shared_len, stride_kcb,
                                  stride_kch, stride_kct, stride_vcb, stride_vch, stride_vct, HAS_PREFIX)
        m, denom, acc = _attend_block(q, k, v, nmask, m, denom, acc, scale)

    if s == SPLITS - 1:  # the new token: written by this split only, attended from registers
        if not HOIST:
            if ROPE:
                k_w, k_wr = _norm_weights(KN, d, QK_NORM, DIM)
            kn, vn = _new_kv(QK, VN, b, h, d, k_w, k_wr, cos, sin, stride_qb, stride_qh, stride_vnb, stride_vnh, eps,
                             HEADS, ROPE, QK_NORM, DIM)
        tl.store(k_base + pos * stride_kct + d, kn)
        tl.store(v_base + pos * stride_vct + d, vn)
        score = tl.sum(q.to(tl.float32) * kn.to(tl.float32)[None, :], 1) * scale
        m_new = tl.maximum(m, score)
        alpha = tl.exp(m - m_new)
        p = tl.exp(score - m_new)
        denom = denom * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * vn.to(tl.float32)[None, :]
        m = m_new

    if SPLITS == 1:
        out = acc / denom[:, None]
        tl.store(OUT + b * stride_ob + heads[:, None] * stride_oh + d[None, :], out.to(OUT.dtype.element_ty),
                 mask=gmask[:, None])
    else:  # an empty split leaves lse -inf and weighs nothing in the combine
        safe = tl.where(denom > 0, denom, 1.0)
        tl.store(PO + b * stride_pob + heads[:, None] * stride_poh + s * stride_pos + d[None, :],
                 acc / safe[:, None], mask=gmask[:, None])
        tl.store(PL + b * stride_plb + heads * stride_plh + s, m + tl.log(safe), mask=gmask)


@triton.jit
def _combine_kernel(PO, PL, OUT, stride_pob, stride_poh, stride_pos, stride_plb, stride_plh, stride_ob, stride_oh,
                    DIM: tl.constexpr, SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, PDL: tl.constexpr):
    b = tl.program_id(0)
    h = tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, DIM)
    smask = s < SPLITS
    lse = tl.load(PL + b * stride_plb + h * stride_plh + s, mask=smask, other=float("-inf"))
    w = tl.exp(lse - tl.max(lse, 0))
    part = tl.load(PO + b * stride_pob + h * stride_poh + s[:, None] * stride_pos + d[None, :], mask=smask[:, None],
                   other=0.0)
    out = tl.sum(part * w[:, None], 0) / tl.sum(w, 0)
    tl.store(OUT + b * stride_ob + h * stride_oh + d, out.to(OUT.dtype.element_ty))


def supports(qk: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Half-precision caches with a power-of-two head dim >= 16; anything else runs the reference."""
    return k_cache.dtype == qk.dtype and supports_cache(k_cache, qk.shape[1] - k_cache.shape[1])


def supports_cache(k_cache: torch.Tensor, heads: int) -> bool:
    """`supports` for any query of ``heads`` heads against this cache."""
    dim, kv_heads = k_cache.shape[-1], k_cache.shape[1]
    return (k_cache.dtype in (torch.float16, torch.bfloat16) and dim >= 16 and dim & (dim - 1) == 0
            and heads % kv_heads == 0)


def split_count(rows: int, kv_heads: int, view: int, sms: int, block_n: int = BLOCK_N) -> int:
    """Splits of the context per (row, KV head): enough programs for two per SM, each >= 2 blocks long."""
    programs = rows * kv_heads
    return max(1, min(triton.cdiv(view, 2 * block_n), triton.cdiv(2 * sms, programs)))


def decode_attention(qk: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     positions: torch.Tensor, scale: float, view: int, prefix_rows: torch.Tensor | None = None,
                     prefix_lens: torch.Tensor | None = None, *, rope: tuple | None = None, splits: int | None = None,
                     block_n: int = BLOCK_N, num_warps: int = 4) -> torch.Tensor:
    """The op's CUDA implementation; ``rope`` ``(cos, sin, q_norm, k_norm, eps)``: ``qk`` is raw, the kernel applies
    q/k-norm (``q_norm`` None: none) and RoPE itself; ``splits``/``block_n``/``num_warps`` are for
    ci/bench_decode_attention.py."""
    has_prefix = prefix_rows is not None
    pdl = pdl_available(qk.device)
    launch = {"launch_pdl": True} if pdl else {}
    kvh = k_cache.shape[1]
    n, heads, dim = qk.shape[0], qk.shape[1] - kvh, qk.shape[2]
    group = heads // kvh
    qk, v_new = (t if t.stride(-1) == 1 else t.contiguous() for t in (qk, v_new))
    out = torch.empty((n, heads, dim), dtype=qk.dtype, device=qk.device)
    splits = splits or split_count(n, kvh, view, sm_count(qk.device), block_n)
    chunk = triton.cdiv(triton.cdiv(view, splits), block_n) * block_n
    if splits == 1:
        part, lse = out, out  # unused by the kernel's one-split branch
        part_strides, lse_strides = (0, 0, 0), (0, 0)
    else:
        part = torch.empty((n, heads, splits, dim), dtype=torch.float32, device=qk.device)
        lse = torch.empty((n, heads, splits), dtype=torch.float32, device=qk.device)
        part_strides, lse_strides = part.stride()[:3], lse.stride()[:2]
    cos, sin, q_norm, k_norm, eps = rope or (qk, qk, None, None, 0.0)  # qk: unused stand-ins without rope
    if rope is not None and (cos.stride() != sin.stride() or cos.stride(-1) != 1 or cos.shape[-1] != dim):
        raise ValueError(f"decode_attention: RoPE tables must be [positions, {dim}] alike with unit last stride")
    _decode_kernel[(n, kvh, splits)](
        qk, v_new, k_cache, v_cache, positions, prefix_rows if has_prefix else positions,
        prefix_lens if has_prefix else positions, out, part, lse, cos, sin,
        q_norm if q_norm is not None else qk, k_norm if k_norm is not None else qk,
        qk.stride(0), qk.stride(1), v_new.stride(0), v_new.stride(1),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1),
        v_cache.stride(2), out.stride(0), out.stride(1), *part_strides, *lse_strides, cos.stride(0),
        scale, chunk, eps,
        HEADS=heads, GROUP=group, BLOCK_G=max(_MIN_GROUP_ROWS, triton.next_power_of_2(group)), DIM=dim,
        BLOCK_N=block_n, SPLITS=splits, HAS_PREFIX=has_prefix, ROPE=rope is not None, QK_NORM=q_norm is not None,
        PDL=pdl, EARLY=os.environ.get("RELAX_DECODE_EARLY", "1") != "0",
        HOIST=os.environ.get("RELAX_DECODE_HOIST", "1") != "0", num_warps=num_warps, **launch)
    if splits > 1:
        _combine_kernel[(n, heads)](part, lse, out, *part_strides, *lse_strides, out.stride(0), out.stride(1),
                                    DIM=dim, SPLITS=splits, BLOCK_S=triton.next_power_of_2(splits), PDL=pdl, **launch)
    return out
