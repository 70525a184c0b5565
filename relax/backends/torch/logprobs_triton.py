"""Fused Triton kernels for `relax.backends.torch.logprobs` (imported only where Triton is).

Why: the reference path gathers the ``n`` selected rows of the logits, upcasts them, divides by
the temperature and takes log-softmax, exp, a product and sums, each a ``[n, V]`` fp32 tensor,
and autograd keeps or rebuilds as many in the backward (forward and backward with entropy at
``n`` = 16k, ``V`` = 32k in bf16 on an H200: 25 ms and 8.8 GiB of temporaries; 1.8 ms and none
here). Here one program per selected token streams that token's logits row once in the
forward (an online max / sum of ``exp`` / sum of ``exp * z`` in fp32) and stores three fp32
numbers (log-prob, entropy, log-sum-exp); the backward streams the row once more, recomputes the
softmax from the saved log-sum-exp and writes the gradient row in the logits' dtype. Nothing of
size ``[n, V]`` is kept between the two.

Semantics are those of ``_token_log_probs``: ``z = row[:vocab_size].float() / temperature``
(no division at temperature 0; here a product with the fp32 ``1 / temperature``, within an ulp of
the quotient), ``log_prob = z[target] - logsumexp(z)``, ``entropy = -sum p log p``.
With upstream gradients ``g_lp`` and ``g_H``, ``dz_j = g_lp (1[j = target] - p_j) - g_H p_j
(log p_j + H)``, divided by the temperature; the logits' gradient is zero elsewhere (unselected
positions, padded vocabulary columns). Targets must lie in ``[0, vocab_size)`` (they are token ids);
they are not checked here, and each (row, position) pair is selected at most once (a causal LM's
positions predict one token each), so backward programs never write the same row.

The logits may be any ``[b, L, V']`` view whose last dimension is contiguous (``V' >= vocab_size``,
e.g. Megatron's vocabulary padded to a multiple of the TP size; or the ``[b, L, V']`` transpose of
Megatron's ``[L, b, V']`` output): each token's row is addressed by the strides of the first two
dimensions, and the gradient is laid out as the logits are. Runs under ``TRITON_INTERPRET=1`` on CPU tensors too, which
is how CI tests it without a GPU.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Vocabulary columns per loop step, and warps per program: of blocks of 1k to 16k columns and 4 to 16
# warps, this was the fastest on an H200 at 16k tokens x a 32k vocabulary in bf16 (forward 0.50 ms,
# backward 0.98 ms with its 0.31 ms zero fill; the reference path took ~25 ms for both).
_MAX_BLOCK = 2048
_NUM_WARPS = 4


@triton.jit
def _forward_kernel(LOGITS, OFFSETS, TARGETS, LOG_PROBS, ENTROPY, LSE, vocab_size, scale,
                    BLOCK: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    i = tl.program_id(0)
    row = LOGITS + tl.load(OFFSETS + i)
    z_target = tl.load(row + tl.load(TARGETS + i)).to(tl.float32) * scale
    cols = tl.arange(0, BLOCK)
    # Running reference m (starts at a finite value of the row, so no inf - inf below), and, relative
    # to it, s = sum exp(z - m) and a = sum exp(z - m) (z - m): rescaled when m grows.
    m = z_target
    s = 0.0
    a = 0.0
    for start in range(0, vocab_size, BLOCK):
        mask = start + cols < vocab_size
        z = tl.load(row + start + cols, mask=mask, other=float("-inf")).to(tl.float32) * scale
        m_new = tl.maximum(m, tl.max(z, 0))
        alpha = tl.exp(m - m_new)
        e = tl.exp(z - m_new)
        if WITH_ENTROPY:
            centred = tl.where(mask, z - m_new, 0.0)  # not -inf: 0 * -inf would be NaN
            a = alpha * (a + s * (m - m_new)) + tl.sum(e * centred, 0)
        s = alpha * s + tl.sum(e, 0)
        m = m_new
    log_s = tl.log(s)
    lse = m + log_s
    tl.store(LOG_PROBS + i, z_target - lse)
    tl.store(LSE + i, lse)
    if WITH_ENTROPY:
        tl.store(ENTROPY + i, log_s - a / s)  # -sum p log p = (lse - m) - sum p (z - m)


@triton.jit
def _backward_kernel(LOGITS, OFFSETS, GRAD, GRAD_OFFSETS, TARGETS, LSE, ENTROPY, GRAD_LP, GRAD_ENT,
                     vocab_size, scale, BLOCK: tl.constexpr, WITH_ENTROPY: tl.constexpr):
    i = tl.program_id(0)
    row = LOGITS + tl.load(OFFSETS + i)
    grad_row = GRAD + tl.load(GRAD_OFFSETS + i)
    target = tl.load(TARGETS + i)
    lse = tl.load(LSE + i)
    g_lp = tl.load(GRAD_LP + i)
    if WITH_ENTROPY:
        h = tl.load(ENTROPY + i)
        g_h = tl.load(GRAD_ENT + i)
    cols = tl.arange(0, BLOCK)
    for start in range(0, vocab_size, BLOCK):
        c = start + cols
        mask = c < vocab_size
        log_p = tl.load(row + c, mask=mask, other=0.0).to(tl.float32) * scale - lse
        p = tl.exp(log_p)
        dz = tl.where(c == target, g_lp, 0.0) - g_lp * p
        if WITH_ENTROPY:
            dz -= g_h * p * (log_p + h)
        tl.store(grad_row + c, (dz * scale).to(GRAD.dtype.element_ty), mask=mask)


def _block(vocab_size: int) -> int:
    return min(_MAX_BLOCK, triton.next_power_of_2(vocab_size))


def _row_offsets(t: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Element offset of each selected row in ``t`` (int64: ``b * L * V'`` can pass 2**31)."""
    return rows * t.stride(0) + positions * t.stride(1)


class _FusedTokenLogProbs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, rows, positions, targets, vocab_size, scale, with_entropy):
        n = rows.numel()
        log_probs = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty_like(log_probs)
        entropy = torch.empty_like(log_probs) if with_entropy else log_probs.new_zeros(())
        targets = targets.contiguous()
        if n:
            _forward_kernel[(n,)](logits, _row_offsets(logits, rows, positions), targets, log_probs,
                                  entropy if with_entropy else log_probs, lse, vocab_size, scale,
                                  BLOCK=_block(vocab_size), WITH_ENTROPY=with_entropy, num_warps=_NUM_WARPS)
        if not with_entropy:
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(logits, rows, positions, targets, lse, entropy)
        ctx.vocab_size, ctx.scale, ctx.with_entropy = vocab_size, scale, with_entropy
        return log_probs, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_log_probs, grad_entropy):
        logits, rows, positions, targets, lse, entropy = ctx.saved_tensors
        # the logits' own layout (a view of Megatron's [L, b, V'] output gets its gradient in that memory order, so the
        # output layer's backward needs no transposing copy of it)
        grad = torch.zeros_like(logits)
        n = rows.numel()
        if n:
            grad_lp = grad_log_probs.float().contiguous()
            grad_ent = grad_entropy.float().contiguous() if ctx.with_entropy else grad_lp
            _backward_kernel[(n,)](logits, _row_offsets(logits, rows, positions), grad,
                                   _row_offsets(grad, rows, positions), targets, lse,
                                   entropy if ctx.with_entropy else lse, grad_lp, grad_ent, ctx.vocab_size,
                                   ctx.scale, BLOCK=_block(ctx.vocab_size), WITH_ENTROPY=ctx.with_entropy,
                                   num_warps=_NUM_WARPS)
        return grad, None, None, None, None, None, None


def fused_token_log_probs(
    logits: torch.Tensor, rows: torch.Tensor, positions: torch.Tensor, targets: torch.Tensor, *,
    vocab_size: int, temperature: float, with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``_token_log_probs`` over ``logits[..., :vocab_size]``: fp32 log-probs ``[n]`` and entropies ``[n]``
    (a 0-d zero without ``with_entropy``, as the reference returns)."""
    if logits.dim() != 3 or logits.stride(-1) != 1:
        raise ValueError(f"fused log-probs need [b, L, V] logits with a contiguous last dim, got shape "
                         f"{tuple(logits.shape)} strides {logits.stride()}")
    if not 0 < vocab_size <= logits.shape[-1]:
        raise ValueError(f"vocab_size {vocab_size} outside (0, {logits.shape[-1]}]")
    scale = 1.0 / temperature if temperature > 0 else 1.0
    return _FusedTokenLogProbs.apply(logits, rows, positions, targets, vocab_size, scale, with_entropy)
