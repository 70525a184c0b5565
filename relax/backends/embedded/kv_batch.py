"""The running batch of the embedded engine: rows, their left-padded KV cache and mask.

Rows join (``merge``: the shorter cache is left-padded with zeros masked out) and leave
(``drop_finished``: rows are index-selected away, then leading all-padding columns are trimmed),
so continuous batching works on top of HF's ``DynamicCache`` without touching model code.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


def _layers(cache: Any) -> list[Any]:
    return list(cache.layers)


def _pad_left(t: torch.Tensor, n: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2 for K/V [B, H, L, D], -1 for the mask [B, L]) by ``n``."""
    if n == 0:
        return t
    if t.dim() == 2:
        return F.pad(t, (n, 0))
    return F.pad(t, (0, 0, n, 0))


class KVBatch:
    def __init__(self, device: torch.device):
        self.device = device
        self.reqs: list[Any] = []
        self.cache: Any = None
        self.mask: torch.Tensor | None = None  # [B, L] 1 = real cache slot
        self.pending: torch.Tensor | None = None  # [B] sampled token not yet in the cache

    def __len__(self) -> int:
        return len(self.reqs)

    def merge(self, reqs: list[Any], cache: Any, mask: torch.Tensor, pending: torch.Tensor) -> None:
        if not self.reqs:
            self.reqs, self.cache, self.mask, self.pending = list(reqs), cache, mask, pending
            return
        old_len, new_len = self.mask.shape[1], mask.shape[1]
        width = max(old_len, new_len)
        for mine, theirs in zip(_layers(self.cache), _layers(cache), strict=True):
            mine.keys = torch.cat([_pad_left(mine.keys, width - old_len), _pad_left(theirs.keys, width - new_len)])
            mine.values = torch.cat([_pad_left(mine.values, width - old_len),
                                     _pad_left(theirs.values, width - new_len)])
        self.mask = torch.cat([_pad_left(self.mask, width - old_len), _pad_left(mask, width - new_len)])
        self.pending = torch.cat([self.pending, pending])
        self.reqs += list(reqs)

    def drop_finished(self) -> None:
        keep = [i for i, r in enumerate(self.reqs) if not r.done]
        if len(keep) == len(self.reqs):
            return
        if not keep:
            self.reqs, self.cache, self.mask, self.pending = [], None, None, None
            return
        idx = torch.tensor(keep, dtype=torch.long, device=self.mask.device)
        self.reqs = [self.reqs[i] for i in keep]
        self.mask = self.mask[idx]
        self.pending = self.pending[idx]
        used = self.mask.any(0).nonzero()
        start = int(used[0]) if len(used) else 0
        self.mask = self.mask[:, start:]
        for layer in _layers(self.cache):
            layer.keys = layer.keys[idx, :, start:]
            layer.values = layer.values[idx, :, start:]
