"""Per-tensor checksums keyed by HF name: the currency of weight-update equality checks.

A checksum is ``"<dtype>[<shape>]:<128-bit digest, 32 hex>"``, so two sides agree only if dtype,
shape and the digest of every byte agree. Tied tensors are reported under every name the state
dict lists, so trainer and engine name sets match.

The digest is computed where the tensor lives (on the GPU for GPU weights): the raw bytes are read
as little-endian 64-bit words w_i and two weighted sums are taken modulo 2**64,
``sum(mix(w_i) * a_i)`` and ``sum(mix(w_i) * b_i)``, with per-position odd weights a_i, b_i from
two multiplicative sequences and ``mix`` an invertible xor-shift. Integer arithmetic is exact, so
CPU and GPU give the same digest for the same bytes whatever the reduction order. Because every
weight is odd and ``mix`` is a bijection, any change confined to one word always changes both sums;
other changes collide with probability ~2**-128 (it is an error detector, not a cryptographic hash).
Before this, a sha256 of the bytes on the host cost ~2.4 s per GB per side (docs/performance.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import partial

import torch

from relax.utils.modules import module_available

_MASK = (1 << 64) - 1


def _signed(value: int) -> int:
    value &= _MASK
    return value - (1 << 64) if value >> 63 else value


_A_MUL, _A_ADD = _signed(0x9E3779B97F4A7C15), _signed(0x632BE59BD9B4E019)
_B_MUL, _B_ADD = _signed(0xC2B2AE3D27D4EB4F), _signed(0x165667B19E3779F9)
_CHUNK = 1 << 22  # words per reduction step: bounds the temporaries to ~100 MB however big the tensor


def _words(t: torch.Tensor) -> torch.Tensor:
    raw = t.detach().contiguous().reshape(-1).view(torch.uint8)
    pad = (-raw.numel()) % 8
    if pad:
        raw = torch.cat([raw, raw.new_zeros(pad)])
    return raw.view(torch.int64)


def _digest(words: torch.Tensor) -> torch.Tensor:
    """``[a, b]`` as an int64 tensor on the words' device (each wraps modulo 2**64; read it as unsigned)."""
    sums = words.new_zeros(2)
    for start in range(0, words.numel(), _CHUNK):
        w = words[start:start + _CHUNK]
        w = w ^ ((w >> 31) & 0x1FFFFFFFF)  # logical xor-shift (a bijection on 64-bit words)
        pos = torch.arange(start, start + w.numel(), device=w.device, dtype=torch.int64)
        sums[0] += (w * ((pos * _A_MUL + _A_ADD) | 1)).sum()  # int64 products and sums wrap modulo 2**64
        sums[1] += (w * ((pos * _B_MUL + _B_ADD) | 1)).sum()
    return sums


def _digests(words: list[torch.Tensor]) -> torch.Tensor:
    """``[n, 2]`` digests of word tensors on one device, one tensor at a time (the CPU path: there, this is as
    fast as batching; on CUDA the Triton kernel reads every word once instead)."""
    return torch.stack([_digest(w) for w in words])


def _format(t: torch.Tensor, a: int, b: int) -> str:
    dtype = str(t.dtype).removeprefix("torch.")
    return f"{dtype}[{','.join(map(str, t.shape))}]:{a & _MASK:016x}{b & _MASK:016x}"


def _device_digests(device: torch.device) -> Callable[[list[torch.Tensor]], torch.Tensor]:
    """The Triton kernel (checksum_triton.py: one pass over the words) on CUDA when triton imports, else `_digests`."""
    if device.type == "cuda" and module_available("triton"):
        from relax.weights import checksum_triton

        return partial(checksum_triton.digests, a=(_A_MUL, _A_ADD), b=(_B_MUL, _B_ADD))
    return _digests


def warm_up(device: torch.device | str) -> None:
    """Compile ``device``'s digest kernel now: Triton compiles it on first use (~0.6 s per process on an H100),
    and a process that warms up at start keeps that out of the run's first weight sync."""
    state_checksums([("warm-up", torch.zeros(2, device=device))])


def tensor_checksum(t: torch.Tensor) -> str:
    return state_checksums([("", t)])[""]


def state_checksums(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    """Every tensor's checksum; the digests stay on their device until one read per device at the end
    (a sync's ~300 tensors on a GPU then cost one host round trip, not one per tensor)."""
    named = list(named_tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, (_, t) in enumerate(named):
        if t.numel():
            by_device.setdefault(t.device, []).append(i)
    digests = [(0, 0)] * len(named)
    for device, indices in by_device.items():
        values = _device_digests(device)([_words(named[i][1]) for i in indices]).tolist()
        for i, (a, b) in zip(indices, values, strict=True):
            digests[i] = (a, b)
    return {name: _format(t, *digests[i]) for i, (name, t) in enumerate(named)}
