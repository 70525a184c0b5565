"""Raw HF <-> megatron-core conversion of whole (unsharded) state dicts (``--megatron-to-hf-mode raw`` at one rank).

Only reshapes, concatenations and splits (relax/backends/megatron/layout.py): no arithmetic, so
HF -> Megatron -> HF is bitwise exact in every dtype. The sharded versions (each rank's slice,
gathered back) are relax/backends/megatron/sharding.py; at one rank they give exactly these tensors.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from relax.backends.megatron.layout import (
    EXTRA_STATE_SUFFIX,
    WeightLayout,
    catalogue,
    combine,
    pack_qkv,
    separate,
    unpack_qkv,
)

__all__ = ["EXTRA_STATE_SUFFIX", "WeightLayout", "hf_to_mcore", "mcore_to_hf", "pack_qkv", "unpack_qkv"]


def _unused(kind: str, names: set[str]) -> KeyError:
    left = sorted(names)
    return KeyError(f"{kind}: {left[:5]}{' ...' if len(left) > 5 else ''}")


def hf_to_mcore(hf: Mapping[str, torch.Tensor], layout: WeightLayout) -> dict[str, torch.Tensor]:
    """An HF state dict (checkpoint names) -> GPTModel state dict (every HF tensor used exactly once)."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise KeyError(f"HF state dict lacks {name!r}")
        used.add(name)
        return hf[name]

    out = {p.name: combine(p, [take(h) for h in p.hf], layout) for p in catalogue(layout)}
    used |= {alias for alias in ("lm_head.weight",) if layout.tie_word_embeddings and alias in hf}  # tied: stored once
    if set(hf) - used:
        raise _unused("HF tensors with no Megatron counterpart", set(hf) - used)
    return out


def mcore_to_hf(mc: Mapping[str, torch.Tensor], layout: WeightLayout) -> dict[str, torch.Tensor]:
    """GPTModel state dict -> HF state dict, with HF's names (lm_head listed when tied, as HF's state dict does)."""
    weights = {k: v for k, v in mc.items() if not k.endswith(EXTRA_STATE_SUFFIX)}
    out: dict[str, torch.Tensor] = {}
    for param in catalogue(layout):
        if param.name not in weights:
            raise KeyError(f"Megatron state dict lacks {param.name!r}")
        out.update(separate(param, weights.pop(param.name), layout))
    if weights:
        raise _unused("Megatron tensors with no HF counterpart", set(weights))
    return out
