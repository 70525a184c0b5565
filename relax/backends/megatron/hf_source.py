"""HF weights under checkpoint names, readable a slice at a time: safetensors files or an in-memory model.

`open_hf_weights` is what the Megatron backend loads ``--hf-checkpoint`` (and ``--opd-teacher-load``) with.

The Megatron backend loads each rank's shard through `HFReader` (relax/backends/megatron/sharding.py):

- `SafetensorsReader`: an HF directory's ``model.safetensors`` or sharded ``model-*.safetensors``
  (with ``model.safetensors.index.json``); ``get_slice`` reads only the requested rows / columns
  from disk, so a rank never holds the tensors of other ranks.
- `StateDictReader`: a model built in memory (``--hf-checkpoint`` presets, random init from a config).

Relax speaks HF checkpoint names (what SGLang loads), not transformers' fused in-memory MoE names;
`checkpoint_state` maps an in-memory state dict to them (views, no copies; relax/models/checkpoint_names.py).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import torch

from relax.backends.megatron.layout import WeightLayout
from relax.models import checkpoint_names as names


def checkpoint_state(state: Mapping[str, torch.Tensor], wl: WeightLayout) -> dict[str, torch.Tensor]:
    """An in-memory HF state dict under checkpoint names: fused MoE experts become per-expert views."""
    return names.checkpoint_state(state, wl.moe_style if wl.num_experts else None)


class StateDictReader:
    """`HFReader` over an in-memory state dict (checkpoint names)."""

    def __init__(self, state: Mapping[str, torch.Tensor]):
        self._state = state

    def names(self) -> set[str]:
        return set(self._state)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._lookup(name).shape)

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        tensor = self._lookup(name)
        if rows is not None:
            tensor = tensor[rows]
        if cols is not None:
            tensor = tensor[:, cols]
        return tensor

    def _lookup(self, name: str) -> torch.Tensor:
        try:
            return self._state[name]
        except KeyError:
            raise KeyError(f"HF weights lack {name!r}") from None


class SafetensorsReader:
    """`HFReader` over an HF directory's safetensors files; reads slices straight from disk."""

    def __init__(self, directory: str | Path):
        from safetensors import safe_open

        root = Path(directory)
        index = root / "model.safetensors.index.json"
        if index.exists():
            weight_map = json.loads(index.read_text())["weight_map"]
            files = sorted(set(weight_map.values()))
        elif (root / "model.safetensors").exists():
            files, weight_map = ["model.safetensors"], None
        else:
            raise FileNotFoundError(f"{root}: no model.safetensors or model.safetensors.index.json")
        self._handles = {f: safe_open(str(root / f), framework="pt") for f in files}
        self._where = weight_map or {k: files[0] for k in self._handles[files[0]].keys()}

    def names(self) -> set[str]:
        return set(self._where)

    def _slice(self, name: str):
        if name not in self._where:
            raise KeyError(f"HF weights lack {name!r}")
        return self._handles[self._where[name]].get_slice(name)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._slice(name).get_shape())

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor:
        part = self._slice(name)
        if rows is None and cols is None:
            return part[:]
        rows = rows if rows is not None else slice(None)
        return part[rows, cols] if cols is not None else part[rows]


def open_hf_weights(name_or_path: str, *, seed: int):
    """(HF config, `HFReader`) for ``--hf-checkpoint``: a directory's safetensors, read slice by slice, or a
    preset built in memory (random init from ``seed``, fp32; presets are small)."""
    from relax.backends.megatron.config import McoreModelSpec
    from relax.models import build_model, resolve_checkpoint

    ckpt = resolve_checkpoint(name_or_path)
    if ckpt.kind == "dir":
        return ckpt.config, SafetensorsReader(name_or_path)
    model = build_model(name_or_path, dtype=torch.float32, seed=seed)
    wl = WeightLayout.from_spec(McoreModelSpec.from_hf(model.config))
    return model.config, StateDictReader(checkpoint_state(model.state_dict(), wl))
