"""Per-tensor checksums keyed by HF name: the currency of weight-update equality checks.

A checksum is ``"<dtype>[<shape>]:<sha256 of the raw bytes, 32 hex>"``, so two sides agree
only if dtype, shape and every bit agree. Tied tensors are reported under every name the
state dict lists, so trainer and engine name sets match.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable

import torch


def tensor_checksum(t: torch.Tensor) -> str:
    data = t.detach().contiguous().cpu()
    raw = data.view(torch.int16) if data.dtype == torch.bfloat16 else data
    digest = hashlib.sha256(raw.numpy().tobytes()).hexdigest()[:32]
    dtype = str(data.dtype).removeprefix("torch.")
    return f"{dtype}[{','.join(map(str, data.shape))}]:{digest}"


def state_checksums(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, str]:
    return {name: tensor_checksum(t) for name, t in named_tensors}
