"""The unfiltered decode sampler in two Triton kernels: temperature, log-softmax, the inverse-CDF pick and the
chosen token's log-prob, for every row of a batch at once.

Why: compiled by inductor, `relax.backends.embedded.sampling.draw` (unfiltered) is five reduction kernels with one
program per row, each program walking the row's whole vocabulary; at batch 64 on the H100 (bench-270m, 32,000
tokens) they took 28 us of a ~770 us decode step (docs/performance.md, the PDL-off profile), for 4 MB of logits
that sit in L2. Here each row's vocabulary is cut into `CHUNK`-wide pieces:

* `_chunk_stats_kernel`, grid ``(rows, chunks)``: per piece, the max of the scaled logits, the sum of their
  exponentials below it, and the first index of the largest raw logit (greedy rows, and the fallback);
* `_pick_kernel`, grid ``(rows,)``: combines the pieces into the row's log-sum-exp and per-piece probability
  mass, draws the row's uniform number from ``(seed, counter)`` (`counter_uniform`'s hash, the same integer ops),
  picks the piece whose cumulative mass crosses ``u * total``, and scans only that piece for the first token whose
  CDF exceeds the target: SGLang-style inverse-CDF sampling in vocabulary order, as `sample_batch` does it, up to
  the float rounding of the sums (which are added in another order). Greedy rows (temperature <= 0) take the
  first largest raw logit; a pick that rounding lands on a zero-probability token takes it too, as there.

Log-probs are ``logits / temperature - logsumexp(logits / temperature)`` of the chosen token in fp32 (temperature
1 for greedy rows), the trainer's convention. Runs under ``TRITON_INTERPRET=1`` on CPU tensors without PDL
(tests/test_triton_sample.py); `relax.backends.embedded.draw_op` is the op that dispatches here.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from relax.backends.embedded.pdl import pdl_available

CHUNK = 4096  # the vocabulary piece one program of `_chunk_stats_kernel` reduces (smaller vocabularies: one piece)


@triton.jit
def _mul32(x, LO: tl.constexpr, HI: tl.constexpr):
    """``(x * c) mod 2**32`` for int64 ``x`` < 2**32, ``c = HI << 16 | LO`` (sampling._mul32's ops)."""
    return (x * LO + (((x * HI) & 0xFFFF) << 16)) & 0xFFFFFFFF


@triton.jit
def _mix32(x):
    """sampling._mix32 (lowbias32) on int64 values < 2**32."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x352D, 0x7FEB)
    x = x ^ (x >> 15)
    x = _mul32(x, 0xA68B, 0x846C)
    return x ^ (x >> 16)


@triton.jit
def counter_uniform(seed, counter):
    """sampling.counter_uniform: a uniform fp32 in [0, 1) from int64 ``seed`` and ``counter``, bit for bit."""
    h = _mix32((counter + 0x9E3779B9) & 0xFFFFFFFF)
    h = _mix32(h ^ ((seed >> 32) & 0xFFFFFFFF))
    h = _mix32(h ^ (seed & 0xFFFFFFFF))
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _chunk_stats_kernel(LOGITS, TEMP, STATS, ARGS, stride_row, V, C, CHUNK: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    piece = tl.program_id(1)
    offs = piece * CHUNK + tl.arange(0, CHUNK)
    valid = offs < V
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    x = tl.load(LOGITS + row * stride_row + offs, mask=valid, other=float("-inf")).to(tl.float32)
    t = tl.load(TEMP + row)
    scaled = tl.math.div_rn(x, tl.where(t > 0, t, 1.0))  # IEEE division, as torch divides
    top = tl.max(scaled, 0)
    below = tl.sum(tl.where(valid, tl.exp(scaled - top), 0.0), 0)
    below = tl.where(top == float("-inf"), 0.0, below)  # a piece of -inf logits holds no mass
    best, at = tl.max(x, 0, return_indices=True, return_indices_tie_break_left=True)
    base = STATS + row * 3 * C + piece
    tl.store(base, top)
    tl.store(base + C, below)
    tl.store(base + 2 * C, best)
    tl.store(ARGS + row * C + piece, piece * CHUNK + at)


@triton.jit
def _pick_kernel(LOGITS, TEMP, SEED, COUNTER, STATS, ARGS, TOKENS, LOGPROBS, stride_row, V, C,
                 CHUNK: tl.constexpr, C_POW2: tl.constexpr, PDL: tl.constexpr):
    row = tl.program_id(0)
    pieces = tl.arange(0, C_POW2)
    real = pieces < C
    t_raw = tl.load(TEMP + row)
    u = counter_uniform(tl.load(SEED + row), tl.load(COUNTER + row))
    if PDL:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    top = tl.load(STATS + row * 3 * C + pieces, mask=real, other=float("-inf"))
    below = tl.load(STATS + row * 3 * C + C + pieces, mask=real, other=0.0)
    best = tl.load(STATS + row * 3 * C + 2 * C + pieces, mask=real, other=float("-inf"))
    at = tl.load(ARGS + row * C + pieces, mask=real, other=V)
    # the row's log-sum-exp of the scaled logits, and each piece's probability mass
    high = tl.max(top, 0)
    held = top > float("-inf")
    lse = high + tl.log(tl.sum(tl.where(held, below * tl.exp(top - high), 0.0), 0))
    mass = tl.where(held, below * tl.exp(top - lse), 0.0)
    # the first index of the largest raw logit: pieces are in vocabulary order, so the smallest such index
    argmax = tl.min(tl.where(best == tl.max(best, 0), at, V), 0)
    # the piece whose cumulative mass first exceeds u * total, then the token inside it (CDF <= target: counted)
    cum = tl.cumsum(mass, 0)
    target = u * tl.max(cum, 0)
    piece = tl.minimum(tl.sum(((cum <= target) & real).to(tl.int32), 0), C - 1)
    before = tl.sum(tl.where(pieces == piece, cum - mass, 0.0), 0)
    lanes = tl.arange(0, CHUNK)
    offs = piece * CHUNK + lanes
    valid = offs < V
    t = tl.where(t_raw > 0, t_raw, 1.0)
    x = tl.load(LOGITS + row * stride_row + offs, mask=valid, other=float("-inf")).to(tl.float32)
    p = tl.where(valid, tl.exp(tl.math.div_rn(x, t) - lse), 0.0)
    cdf = before + tl.cumsum(p, 0)
    k = tl.minimum(tl.sum(((cdf <= target) & valid).to(tl.int32), 0), tl.minimum(V - piece * CHUNK, CHUNK) - 1)
    p_k = tl.sum(tl.where(lanes == k, p, 0.0), 0)
    token = tl.where((t_raw <= 0) | (p_k <= 0), argmax, piece * CHUNK + k)
    chosen = tl.load(LOGITS + row * stride_row + token).to(tl.float32)
    tl.store(TOKENS + row, token.to(tl.int64))
    tl.store(LOGPROBS + row, tl.math.div_rn(chosen, t) - lse)


def supports(logits: torch.Tensor) -> bool:
    """2-D floating-point logits with contiguous rows (what the kernels index)."""
    return (logits.dim() == 2 and logits.shape[0] > 0 and logits.shape[1] > 0 and logits.stride(1) == 1
            and logits.dtype in (torch.float32, torch.float16, torch.bfloat16))


def sample_unfiltered(logits: torch.Tensor, temperature: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor, *,
                      pdl: bool | None = None, chunk: int = CHUNK) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of ``logits [B, V]`` and its log-prob: `sampling.draw` without top-p/top-k, each row's
    uniform number from its int64 ``seed`` and ``counter`` ([B] each), ``temperature`` [B] fp32 (<= 0: greedy).
    Returns ``(tokens [B] int64, logprobs [B] fp32)``. The caller checks `supports` first; ``chunk`` (a power of
    two) is the vocabulary piece of one program, capped at the vocabulary's next power of two."""
    rows, vocab = logits.shape
    chunk = min(chunk, triton.next_power_of_2(vocab))
    pieces = triton.cdiv(vocab, chunk)
    use_pdl = pdl_available(logits.device) if pdl is None else pdl
    launch = {"launch_pdl": True} if use_pdl else {}
    stats = torch.empty((rows, 3, pieces), dtype=torch.float32, device=logits.device)
    args = torch.empty((rows, pieces), dtype=torch.int32, device=logits.device)
    tokens = torch.empty(rows, dtype=torch.int64, device=logits.device)
    logprobs = torch.empty(rows, dtype=torch.float32, device=logits.device)
    temperature = temperature.float()
    _chunk_stats_kernel[(rows, pieces)](logits, temperature, stats, args, logits.stride(0), vocab, pieces,
                                        CHUNK=chunk, PDL=use_pdl, num_warps=4, **launch)
    _pick_kernel[(rows,)](logits, temperature, seed, counter, stats, args, tokens, logprobs, logits.stride(0), vocab,
                          pieces, CHUNK=chunk, C_POW2=triton.next_power_of_2(pieces), PDL=use_pdl, num_warps=4,
                          **launch)
    return tokens, logprobs
