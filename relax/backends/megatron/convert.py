"""Raw HF <-> megatron-core conversion of whole (unsharded) state dicts, and ``--megatron-to-hf-mode``.

Only reshapes, concatenations and splits (relax/backends/megatron/layout.py): no arithmetic, so
HF -> Megatron -> HF is bitwise exact in every dtype. The sharded versions (each rank's slice,
gathered back) are relax/backends/megatron/sharding.py; at one rank they give exactly these tensors.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.layout import (
    EXTRA_STATE_SUFFIX,
    WeightLayout,
    catalogue,
    combine,
    pack_qkv,
    separate,
    unpack_qkv,
)

__all__ = ["EXTRA_STATE_SUFFIX", "WeightLayout", "converters", "hf_to_mcore", "mcore_to_hf", "pack_qkv",
           "unpack_qkv"]


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


# ---------------------------------------------------------------------- --megatron-to-hf-mode
Converter = Callable[[Mapping[str, torch.Tensor], WeightLayout], dict[str, torch.Tensor]]


def converters(mode: str) -> tuple[Converter, Converter]:
    """(hf_to_mcore, mcore_to_hf) for ``--megatron-to-hf-mode raw``; ``bridge`` is relax/backends/megatron/bridge.py."""
    if mode == "raw":
        return hf_to_mcore, mcore_to_hf
    if mode == "bridge":
        raise ValueError("--megatron-to-hf-mode bridge converts through megatron-bridge's AutoBridge "
                         "(relax/backends/megatron/bridge.py), not these raw converters")
    raise ValueError(f"--megatron-to-hf-mode {mode!r}: expected raw or bridge")


def bridge_available() -> bool:
    return module_available("megatron.bridge")
