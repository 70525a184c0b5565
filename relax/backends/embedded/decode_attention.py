"""One decode step's attention over the slot KV cache, as one op: write the new K/V, attend, return.

Why an op of its own: in the lean runner's decode step, attention was six kernels per layer (two
K/V index writes, a mask-bias ``baddbmm`` over a length bucket, softmax, a cast, ``bmm`` with V), and
the bucket made it read up to ~25% more cache than the rows hold. On CUDA this op is one Triton
flash-decoding kernel (`relax.backends.embedded.triton_decode`): each program owns one (row, KV
head) pair and the whole group of query heads that share it, streams only the cache positions the
row has, keeps the softmax online in fp32 and writes the new token's K/V itself. Elsewhere (CPU,
fp32, no Triton) it runs `reference_decode_attention`, the grouped ``baddbmm``/softmax/``bmm``
the runner used before.

It is a ``torch.library`` custom op that declares the two caches it mutates, so ``torch.compile``
keeps it as one opaque call (no copy of the caches: the mutation is of graph inputs) and a CUDA
graph captures its kernels like any other.

Shapes: ``qk [n, heads + kv_heads, dim]`` (the queries, then the new keys, after RoPE: one
buffer, as the fused QKV projection and RoPE leave them, so ``torch.compile`` need not copy two
slices of it out for the op), ``v_new [n, kv_heads, dim]``, caches
``[slots, kv_heads, max_len, dim]`` with row ``i`` in slot ``i``, ``positions [n]`` (tokens of
row ``i`` already in the cache; the new K/V goes there), ``view`` an upper bound of
``max(positions) + 1`` (the captured graph's length bucket). Returns ``[n, heads, dim]``.

Fused q/k-norm and RoPE: with ``cos``/``sin`` (the lean runner's ``[max_len, dim]`` tables, the rotate-half sign
folded into ``sin``), ``q_norm``/``k_norm`` (per-head RMSNorm weights, or None) and ``eps``, ``qk`` is the raw
projection and the op normalizes and rotates it at ``positions`` first (`prepare_qk`: rounded as HF's eager
modules; the Triton kernel does it in registers, one elementwise kernel a layer fewer).

Shared prompts: with ``prefix_rows``/``prefix_lens`` (``[n]`` each), row ``i`` reads its positions
``< prefix_lens[i]`` from slot ``prefix_rows[i]`` (the row that holds the prompt they share; the lean
runner's prompt sharing) and the rest from its own slot; it writes only its own slot.
"""

from __future__ import annotations

import torch

from relax.backends.embedded.norm_rope import rms_norm, rotate
from relax.utils.modules import optional_module


def mask_bias(positions: torch.Tensor, view: int, heads: int, kv_heads: int, dtype: torch.dtype) -> torch.Tensor:
    """``[n * kv_heads, group, view]``: 0 where a row's key exists (``<= position``), -inf past it."""
    n, group = positions.shape[0], heads // kv_heads
    keys = torch.arange(view, device=positions.device)
    bias = torch.zeros((n, 1, 1, view), dtype=dtype, device=positions.device)
    bias = bias.masked_fill(keys[None, None, None, :] > positions[:, None, None, None], float("-inf"))
    return bias.expand(n, kv_heads, group, view).reshape(n * kv_heads, group, view)


def prepare_qk(qk: torch.Tensor, positions: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               q_norm: torch.Tensor | None, k_norm: torch.Tensor | None, eps: float, kv_heads: int) -> torch.Tensor:
    """q/k-norm (each head's RMSNorm, when ``q_norm`` is given) and RoPE of the raw ``qk`` at ``positions``, rounded
    as HF's eager modules round them (the op's ``cos=`` form; its Triton kernel does the same in registers): the
    lean runner's own eager `norm_rope` functions (the op's body runs eagerly, also under torch.compile).
    ``cos`` / ``sin`` are the runner's ``[max_len, dim]`` tables (``sin`` with the rotate-half sign folded in)."""
    heads = qk.shape[1] - kv_heads
    if q_norm is not None:
        qk = rms_norm(qk, torch.cat([q_norm.expand(heads, -1), k_norm.expand(kv_heads, -1)]), eps)
    return rotate(qk, cos[positions].unsqueeze(1), sin[positions].unsqueeze(1))


def reference_decode_attention(qk: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                               positions: torch.Tensor, scale: float, view: int,
                               prefix_rows: torch.Tensor | None = None, prefix_lens: torch.Tensor | None = None,
                               bias: torch.Tensor | None = None) -> torch.Tensor:
    """Write K/V at ``positions``, then grouped attention over ``[:view]`` with keys past each row masked.

    ``prefix_rows``/``prefix_lens``: shared prompts (module docstring). ``bias``: `mask_bias` of these
    positions, when the caller shares one across layers."""
    kvh = k_cache.shape[1]
    n, heads, dim = qk.shape[0], qk.shape[1] - kvh, qk.shape[2]
    q, k_new = qk[:, :heads], qk[:, heads:]
    group = heads // kvh
    rows = torch.arange(n, device=q.device)
    k_cache[rows, :, positions] = k_new
    v_cache[rows, :, positions] = v_new
    if bias is None:
        bias = mask_bias(positions, view, heads, kvh, q.dtype)
    keys_i, values_i = k_cache[:n, :, :view], v_cache[:n, :, :view]
    if prefix_rows is not None:
        shared = (torch.arange(view, device=q.device) < prefix_lens[:, None])[:, None, :, None]
        keys_i = torch.where(shared, k_cache[prefix_rows, :, :view], keys_i)
        values_i = torch.where(shared, v_cache[prefix_rows, :, :view], values_i)
    keys_i, values_i = keys_i.reshape(n * kvh, view, dim), values_i.reshape(n * kvh, view, dim)
    scores = torch.baddbmm(bias, q.reshape(n * kvh, group, dim), keys_i.transpose(1, 2), alpha=scale)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
    return torch.bmm(probs, values_i).reshape(n, heads, dim)


@torch.library.custom_op("relax::decode_attention", mutates_args=("k_cache", "v_cache"))
def decode_attention(qk: torch.Tensor, v_new: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                     positions: torch.Tensor, scale: float, view: int, prefix_rows: torch.Tensor | None = None,
                     prefix_lens: torch.Tensor | None = None, cos: torch.Tensor | None = None,
                     sin: torch.Tensor | None = None, q_norm: torch.Tensor | None = None,
                     k_norm: torch.Tensor | None = None, eps: float = 0.0) -> torch.Tensor:
    """See the module docstring; this is the CPU (and fallback) implementation. With ``cos`` / ``sin`` the op takes
    ``qk`` raw, as the QKV projection leaves it, and applies q/k-norm and RoPE first (`prepare_qk`)."""
    if cos is not None:
        qk = prepare_qk(qk, positions, cos, sin, q_norm, k_norm, eps, k_cache.shape[1])
    return reference_decode_attention(qk, v_new, k_cache, v_cache, positions, scale, view, prefix_rows, prefix_lens)


@decode_attention.register_fake
def _(qk, v_new, k_cache, v_cache, positions, scale, view, prefix_rows=None, prefix_lens=None, cos=None, sin=None,
      q_norm=None, k_norm=None, eps=0.0):
    return qk.new_empty((qk.shape[0], qk.shape[1] - k_cache.shape[1], qk.shape[2]))


@decode_attention.register_kernel("cuda")
def _(qk, v_new, k_cache, v_cache, positions, scale, view, prefix_rows=None, prefix_lens=None, cos=None, sin=None,
      q_norm=None, k_norm=None, eps=0.0):
    kernel = _triton_decode()
    if kernel is None or not kernel.supports(qk, k_cache):
        if cos is not None:
            qk = prepare_qk(qk, positions, cos, sin, q_norm, k_norm, eps, k_cache.shape[1])
        return reference_decode_attention(qk, v_new, k_cache, v_cache, positions, scale, view, prefix_rows,
                                          prefix_lens)
    rope = None if cos is None else (cos, sin, q_norm, k_norm, eps)
    return kernel.decode_attention(qk, v_new, k_cache, v_cache, positions, scale, view, prefix_rows, prefix_lens,
                                   rope=rope)


def reads_only_rows(k_cache: torch.Tensor, heads: int) -> bool:
    """Whether the op runs the Triton kernel on this cache. That kernel reads each row only up to its own
    position, so ``view`` bounds nothing it reads (it sizes the context splits of few-row batches): one
    captured graph per batch size can serve every length (the lean runner's colocate rollouts then capture
    once after each memory release, not once per length bucket)."""
    if k_cache.device.type != "cuda":
        return False
    kernel = _triton_decode()
    return kernel is not None and kernel.supports_cache(k_cache, heads)


def _triton_decode():
    """The Triton kernel's module, or None where Triton is missing (the reference runs then)."""
    return optional_module("relax.backends.embedded.triton_decode", "decode attention runs the reference (slower)")
