"""Sampling parameters and the batched sampler of the embedded engine.

Log-prob convention (shared with the trainer): ``log_softmax(logits / temperature)`` of the
chosen token in fp32, *before* top-p/top-k filtering; temperature 0 is greedy and reports the
raw ``log_softmax(logits)``.

Determinism: the random number for the token a request samples at sequence position ``i`` is a
counter-based hash of ``(seed, i)`` computed with integer tensor ops (`counter_uniform`), so it needs
no per-request generator object, runs inside a captured CUDA graph and gives the same numbers on CPU
and GPU. Hashing the position, not the response index, is SGLang's ``sampling_seed`` semantics (its
seeded sampler hashes seed and position): the turns of a multi-turn rollout that reuse one seed draw
different numbers, and a request resumed from its partial tokens continues the same stream.
The token is the inverse-CDF pick of that number over the request's filtered distribution in
vocabulary order; every row is computed from its own logits and parameters only, so the same
seed and request give the same tokens whatever else shares the batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from relax.engine.protocol import SAMPLING_NONE_IS_DEFAULT, SAMPLING_PARAMS, check_fields

# The SGLang sampling_params fields this engine implements (relax.engine.protocol.SAMPLING_PARAMS has all of
# them); any other field is accepted only at SGLang's default, and answers 400 naming it otherwise.
_FIELD_TYPES: dict[str, tuple[type, ...]] = {
    "temperature": (int, float),
    "top_p": (int, float),
    "top_k": (int,),
    "max_new_tokens": (int,),
    "stop": (str, list, tuple),
    "stop_token_ids": (list, tuple),
    "sampling_seed": (int,),
    "skip_special_tokens": (bool,),
    "no_stop_trim": (bool,),
    "ignore_eos": (bool,),
}
IMPLEMENTED = frozenset(_FIELD_TYPES)
_RENAMED = {"seed": "sampling_seed"}  # names other APIs use for SGLang's fields


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    sampling_seed: int | None = None
    skip_special_tokens: bool = True
    no_stop_trim: bool = False  # keep the matched stop string / token in ``text`` (SGLang trims it)
    ignore_eos: bool = False  # neither EOS nor stop_token_ids end the request (SGLang's semantics)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> SamplingParams:
        """Validate an SGLang ``sampling_params`` dict; raises ``ValueError`` naming the bad field."""
        if d is None:
            d = {}
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be an object, got {type(d).__name__}")
        renamed = [f"{k} (SGLang names it {_RENAMED[k]})" for k in d if k in _RENAMED]
        if renamed:
            raise ValueError(f"sampling_params: unknown field(s): {', '.join(renamed)}")
        check_fields(d, SAMPLING_PARAMS, IMPLEMENTED, "sampling_params", SAMPLING_NONE_IS_DEFAULT)
        clean: dict[str, Any] = {}
        for key, types in _FIELD_TYPES.items():
            value = d.get(key)
            if value is None:
                continue
            if isinstance(value, bool) and bool not in types or not isinstance(value, types):
                raise ValueError(f"sampling_params.{key} has the wrong type: {value!r}")
            clean[key] = value
        if isinstance(clean.get("stop"), str):
            clean["stop"] = [clean["stop"]]
        if "stop_token_ids" in clean:  # SGLang 0.5.14 drops null ids
            clean["stop_token_ids"] = [t for t in clean["stop_token_ids"] if t is not None]
        for key in ("stop", "stop_token_ids"):
            if key in clean:
                clean[key] = tuple(clean[key])
        if not all(isinstance(s, str) and s for s in clean.get("stop", ())):
            raise ValueError("sampling_params.stop must be non-empty strings")
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in clean.get("stop_token_ids", ())):
            raise ValueError("sampling_params.stop_token_ids must be integers")
        params = cls(**clean)
        if params.max_new_tokens < 0:  # 0: prefill only (prompt log-probs), as in SGLang
            raise ValueError(f"sampling_params.max_new_tokens must be >= 0, got {params.max_new_tokens}")
        if not math.isfinite(params.temperature) or params.temperature < 0:
            raise ValueError(f"sampling_params.temperature must be >= 0, got {params.temperature}")
        if not 0 < params.top_p <= 1:
            raise ValueError(f"sampling_params.top_p must be in (0, 1], got {params.top_p}")
        if params.top_k == 0 or params.top_k < -1:
            raise ValueError(f"sampling_params.top_k must be -1 (off) or >= 1, got {params.top_k}")
        return params


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``(x * c) mod 2**32`` for int64 ``x`` < 2**32 without signed overflow (16-bit halves of c)."""
    return (x * (c & 0xFFFF) + (((x * (c >> 16)) & 0xFFFF) << 16)) & _M32


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit integer finalizer (lowbias32): every input bit flips each output bit ~50%."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = _mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def counter_uniform(seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """Uniform fp32 in [0, 1) from int64 ``seed`` (< 2**63) and token index ``counter``, elementwise."""
    h = _mix32((counter + 0x9E3779B9) & _M32)
    h = _mix32(h ^ ((seed >> 32) & _M32))
    h = _mix32(h ^ (seed & _M32))
    return (h >> 8).to(torch.float32) * (1.0 / (1 << 24))


_SCAN_BLOCK = 128


def blocked_cumsum(x: torch.Tensor, block: int = _SCAN_BLOCK) -> torch.Tensor:
    """``x.cumsum(-1)`` of a ``[B, V]`` tensor as scans of ``block``-wide pieces plus their offsets.

    Why: a GPU scan over a 32k-token vocabulary with only B rows has too little parallelism (43 us
    of a 1.8 ms decode step at B=64 on the H100); B*V/block short scans and one scan of the block
    totals do the same sum in another order (float rounding differs from a sequential scan by ulps).
    """
    rows, width = x.shape
    pieces = torch.nn.functional.pad(x, (0, -width % block)).view(rows, -1, block).cumsum(-1)
    totals = pieces[..., -1].cumsum(-1)
    offsets = torch.cat([torch.zeros_like(totals[:, :1]), totals[:, :-1]], dim=-1)
    return (pieces + offsets.unsqueeze(-1)).view(rows, -1)[:, :width]


def draw(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
         seed: torch.Tensor, counter: torch.Tensor, filtered: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """`sample_batch` with each row's random number from ``(seed, counter)``: one sampling step, whole
    (the lean runner compiles it, so the hash's integer ops and the sampler fuse into a few kernels)."""
    return sample_batch(logits, temperature, top_p, top_k, counter_uniform(seed, counter), filtered=filtered)


def sample_batch(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor, top_k: torch.Tensor,
                 uniform: torch.Tensor, filtered: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row; return ``(tokens [B] long, logprobs [B] fp32)``.

    ``temperature``/``top_p``/``uniform`` are [B] fp32 tensors, ``top_k`` [B] long (<= 0 means off);
    rows with temperature 0 are greedy. ``filtered=False`` promises that no row uses top-p/top-k
    and skips the sort; a row without filters gets the same token either way.
    """
    logits = logits.float()
    vocab = logits.shape[-1]
    greedy = temperature <= 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    logprobs_all = torch.log_softmax(scaled, dim=-1)
    probs = logprobs_all.exp()
    if filtered:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True, stable=True)
        before = blocked_cumsum(sorted_probs) - sorted_probs  # mass strictly above each rank
        ranks = torch.arange(vocab, device=logits.device).unsqueeze(0)
        k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab)).unsqueeze(-1)
        keep_sorted = ((before < top_p.unsqueeze(-1)) | (top_p >= 1).unsqueeze(-1)) & (ranks < k)
        keep_sorted[:, 0] = True  # the top token always survives
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
        probs = probs * keep
    cdf = blocked_cumsum(probs)
    target = (uniform * cdf[:, -1]).unsqueeze(-1)
    # the first index whose CDF exceeds the target = how many entries do not (searchsorted's right=True as a
    # reduction: it fuses under torch.compile, whose CUDA searchsorted lowering fails on a sliced CDF)
    pick = (cdf <= target).sum(-1, keepdim=True).clamp_(max=vocab - 1)
    ok = probs.gather(-1, pick) > 0  # rounding can land past the last kept token
    sampled = torch.where(ok, pick, probs.argmax(-1, keepdim=True)).squeeze(-1)

    tokens = torch.where(greedy, logits.argmax(-1), sampled)
    logprobs = logprobs_all.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)
    return tokens, logprobs
