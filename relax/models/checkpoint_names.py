"""HF checkpoint names vs transformers' in-memory names: what every weight sync speaks.

transformers >= 5 keeps a MoE layer's experts fused in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``,
``mlp.experts.down_proj`` ``[E, H, I]``, the router as ``mlp.gate.weight``) and writes them per expert on
save (Qwen3-MoE ``mlp.experts.{e}.gate_proj.weight``, Mixtral ``block_sparse_moe.experts.{e}.w1.weight``).
Checkpoint names are what SGLang loads and what the Megatron backend exports, so every side of a sync
(trainers, the embedded engine, weights.jsonl) names tensors that way. `checkpoint_state` gives views of
the fused tensors under those names: no copies, and writing into a view writes the model's parameter.
Dense models keep their names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import torch

EXPERT_NAMES = {  # moe_style (the HF config's model_type) -> (block prefix, gate, up, down)
    "qwen3_moe": ("mlp", "gate_proj", "up_proj", "down_proj"),
    "mixtral": ("block_sparse_moe", "w1", "w3", "w2"),
}

_FUSED = re.compile(r"^(model\.layers\.\d+\.)mlp\.experts\.(gate_up_proj|down_proj)$")
_ROUTER = re.compile(r"^(model\.layers\.\d+\.)mlp\.gate\.weight$")


def moe_style(config: Any) -> str | None:
    """The expert naming of an HF config (``model_type`` of a MoE family), or None for a dense model."""
    style = getattr(config, "model_type", None)
    return style if style in EXPERT_NAMES else None


def checkpoint_state(state: Mapping[str, torch.Tensor], style: str | None) -> dict[str, torch.Tensor]:
    """An in-memory HF state dict under checkpoint names (``style``: `moe_style`; None: names unchanged)."""
    if style is None:
        return dict(state)
    block, gate, up, down = EXPERT_NAMES[style]
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        match = _FUSED.match(name)
        if match is None:
            router = _ROUTER.match(name)
            out[f"{router.group(1)}{block}.gate.weight" if router else name] = tensor
            continue
        prefix, kind = match.groups()
        for e in range(tensor.shape[0]):
            base = f"{prefix}{block}.experts.{e}."
            if kind == "down_proj":
                out[base + f"{down}.weight"] = tensor[e]
            else:
                g, u = torch.chunk(tensor[e], 2, dim=0)
                out[base + f"{gate}.weight"], out[base + f"{up}.weight"] = g, u
    return out
