"""HF checkpoint names vs transformers' in-memory names: what every weight sync speaks.

transformers >= 5 keeps a MoE layer's experts fused in memory (``mlp.experts.gate_up_proj`` ``[E, 2I, H]``,
``mlp.experts.down_proj`` ``[E, H, I]``, the router as ``mlp.gate.weight``) and writes them per expert on
save (Qwen3-MoE ``mlp.experts.{e}.gate_proj.weight``, Mixtral ``block_sparse_moe.experts.{e}.w1.weight``).
Checkpoint names are what SGLang loads and what the Megatron backend exports, so every side of a sync
(trainers, the embedded engine, weights.jsonl) names tensors that way. `checkpoint_state` gives views of
the fused tensors under those names: no copies, and writing into a view writes the model's parameter.
Dense models keep their names.

A vision-language model (Qwen2-VL, Qwen2.5-VL, the Qwen2.5-Omni thinker) is held as ``model.language_model.*``,
``model.visual.*`` (``model.audio_tower.*``) and ``lm_head`` since transformers 4.52, and written as the original
checkpoints name it: ``model.*``, ``visual.*``, ``audio_tower.*``. SGLang 0.5.14's
``Qwen2_5_VLForConditionalGeneration.load_weights`` takes only the latter (its ``hf_to_sglang_mapper`` renames
quantization configs, not weights): ``model.language_model.layers.0.self_attn.qkv_proj.weight`` is not one of its
parameters (a KeyError), and ``model.visual.*`` tensors are skipped without a word. So the sync speaks the
checkpoint names there too; a name already in that form (the omni thinker under transformers 5.17) is kept.
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

# transformers' in-memory prefix of a vision-language model's part -> the checkpoint's (save_pretrained's)
VLM_PREFIXES = (("model.language_model.", "model."), ("model.visual.", "visual."), ("model.audio_tower.", "audio_tower."))

_FUSED = re.compile(r"^(model\.layers\.\d+\.)mlp\.experts\.(gate_up_proj|down_proj)$")
_ROUTER = re.compile(r"^(model\.layers\.\d+\.)mlp\.gate\.weight$")


def moe_style(config: Any) -> str | None:
    """The expert naming of an HF config (``model_type`` of a MoE family), or None for a dense model."""
    style = getattr(config, "model_type", None)
    return style if style in EXPERT_NAMES else None


def checkpoint_name(name: str) -> str:
    """A vision-language model's in-memory tensor name under its checkpoint name (`VLM_PREFIXES`); others unchanged."""
    for held, written in VLM_PREFIXES:
        if name.startswith(held):
            return written + name[len(held):]
    return name


def checkpoint_state(state: Mapping[str, torch.Tensor], style: str | None) -> dict[str, torch.Tensor]:
    """An in-memory HF state dict under checkpoint names (``style``: `moe_style`; None: a dense model, whose names
    change only where it is a vision-language model's, `checkpoint_name`)."""
    if style is None:
        return {checkpoint_name(name): tensor for name, tensor in state.items()}
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
