"""``--save-hf`` (and ``relax convert`` to HF) for a sharded model: rank 0 writes the gathered buckets as they come.

Each export bucket (full HF tensors, gathered from every rank: export.py) becomes one safetensors
shard, written and dropped before the next bucket is gathered, so no rank ever holds the whole
model; then the shards are named ``model-0000i-of-0000n.safetensors`` with HF's
``model.safetensors.index.json`` (one shard: ``model.safetensors``), next to the config (dtype set
to the weights') and the tokenizer, so ``AutoModelForCausalLM.from_pretrained`` loads the directory
offline. Names are checkpoint names (per-expert MoE tensors, which transformers fuses on load); a
tied ``lm_head.weight`` is not written (HF ties it on load).
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterable
from pathlib import Path

import torch
import torch.distributed as dist


def write_hf_checkpoint(directory: str | Path, buckets: Iterable[list[tuple[str, torch.Tensor]]], config,
                        tokenizer_source: str | None, *, tied: bool) -> None:
    """Iterate ``buckets`` (every rank must: they gather); rank 0 writes them, the config and the tokenizer."""
    from safetensors.torch import save_file

    writer = (dist.get_rank() if dist.is_initialized() else 0) == 0
    path = Path(directory)
    shards: list[tuple[Path, list[str], int]] = []  # (file, tensor names, bytes)
    dtype = None
    for bucket in buckets:
        named = {name: t.detach().cpu().contiguous() for name, t in bucket if not (tied and name == "lm_head.weight")}
        if not writer or not named:
            continue
        path.mkdir(parents=True, exist_ok=True)
        file = path / f"shard-{len(shards):05d}.safetensors.tmp"
        save_file(named, str(file), metadata={"format": "pt"})
        shards.append((file, sorted(named), sum(t.numel() * t.element_size() for t in named.values())))
        dtype = dtype or next(iter(named.values())).dtype
    if not writer:
        return
    if not shards:
        raise RuntimeError("--save-hf: the export produced no tensors")
    _name_shards(path, shards)
    hf_config = copy.deepcopy(config)
    hf_config.dtype = dtype
    hf_config.save_pretrained(path)
    if tokenizer_source is not None:
        from relax.models import load_tokenizer

        load_tokenizer(tokenizer_source).save_pretrained(path)


def _name_shards(path: Path, shards: list[tuple[Path, list[str], int]]) -> None:
    if len(shards) == 1:
        shards[0][0].replace(path / "model.safetensors")
        return
    weight_map = {}
    for i, (file, names, _) in enumerate(shards):
        final = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        file.replace(path / final)
        weight_map.update(dict.fromkeys(names, final))
    index = {"metadata": {"total_size": sum(size for _, _, size in shards)}, "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index, indent=2, sort_keys=True))
