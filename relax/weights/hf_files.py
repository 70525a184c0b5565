"""HF checkpoint files as named tensors (``/update_weights_from_disk``, snapshots written to disk)."""

from __future__ import annotations

import os
from pathlib import Path

import torch


def read_safetensors(path: str | os.PathLike) -> list[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    if not Path(path).is_file():
        raise ValueError(f"no weights file at {path}")
    with safe_open(str(path), framework="pt") as f:
        return [(name, f.get_tensor(name)) for name in f.keys()]


def read_hf_dir(model_path: str | os.PathLike) -> list[tuple[str, torch.Tensor]]:
    """Every tensor of the ``*.safetensors`` files in an HF checkpoint directory."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {model_path}")
    return [item for f in files for item in read_safetensors(f)]
