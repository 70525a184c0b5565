"""Raw HF <-> megatron-core weight conversion (``--megatron-to-hf-mode raw``), on plain tensors.

Only reshapes, concatenations and splits: no arithmetic, so HF -> Megatron -> HF is bitwise
exact in every dtype. Names follow megatron-core's GPTModel with the local layer spec, or with
the Transformer Engine spec (``fused_norms``), where the pre-attention and pre-MLP RMSNorm
weights live inside the fused ``linear_qkv`` / ``linear_fc1`` modules.

Megatron's fused QKV weight is grouped per key/value head: for each of the ``g`` query groups,
its ``h/g`` query heads, then its key head, then its value head, each ``head_dim`` rows. The
fused ``linear_fc1`` of a SwiGLU MLP is ``[gate; up]``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.config import McoreModelSpec

EXTRA_STATE_SUFFIX = "_extra_state"  # Transformer Engine's per-module metadata: not a weight


@dataclass(frozen=True)
class WeightLayout:
    num_layers: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    qk_layernorm: bool
    qkv_bias: bool
    tie_word_embeddings: bool
    fused_norms: bool = False  # Transformer Engine layer spec

    @classmethod
    def from_spec(cls, spec: McoreModelSpec, *, fused_norms: bool = False) -> WeightLayout:
        return cls(spec.num_layers, spec.num_attention_heads, spec.num_query_groups, spec.kv_channels,
                   spec.qk_layernorm, spec.add_qkv_bias, spec.tie_word_embeddings, fused_norms)

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    def norm_names(self, layer: int) -> tuple[str, str]:
        p = f"decoder.layers.{layer}."
        if self.fused_norms:
            return p + "self_attention.linear_qkv.layer_norm_weight", p + "mlp.linear_fc1.layer_norm_weight"
        return p + "input_layernorm.weight", p + "pre_mlp_layernorm.weight"


# ---------------------------------------------------------------------- QKV packing
def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: WeightLayout) -> torch.Tensor:
    """HF q/k/v (weights ``[n*d, H]`` or biases ``[n*d]``) -> Megatron's grouped ``linear_qkv``."""
    g, d, hpg = layout.num_query_groups, layout.head_dim, layout.heads_per_group
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(g, hpg * d, *rest), k.reshape(g, d, *rest), v.reshape(g, d, *rest)], dim=1)
    return fused.reshape(g * (hpg + 2) * d, *rest)


def unpack_qkv(qkv: torch.Tensor, layout: WeightLayout) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g, d, hpg = layout.num_query_groups, layout.head_dim, layout.heads_per_group
    rest = qkv.shape[1:]
    grouped = qkv.reshape(g, (hpg + 2) * d, *rest)
    q, k, v = torch.split(grouped, [hpg * d, d, d], dim=1)
    return (q.reshape(g * hpg * d, *rest).contiguous(), k.reshape(g * d, *rest).contiguous(),
            v.reshape(g * d, *rest).contiguous())


# ---------------------------------------------------------------------- whole state dicts
def _layer_pairs(layout: WeightLayout, i: int) -> list[tuple[str, str]]:
    """One-to-one renames of layer ``i``: (HF name, Megatron name)."""
    hf, mc = f"model.layers.{i}.", f"decoder.layers.{i}."
    attn_norm, mlp_norm = layout.norm_names(i)
    pairs = [
        (hf + "input_layernorm.weight", attn_norm),
        (hf + "post_attention_layernorm.weight", mlp_norm),
        (hf + "self_attn.o_proj.weight", mc + "self_attention.linear_proj.weight"),
        (hf + "mlp.down_proj.weight", mc + "mlp.linear_fc2.weight"),
    ]
    if layout.qk_layernorm:
        pairs += [(hf + "self_attn.q_norm.weight", mc + "self_attention.q_layernorm.weight"),
                  (hf + "self_attn.k_norm.weight", mc + "self_attention.k_layernorm.weight")]
    return pairs


def _top_pairs(layout: WeightLayout) -> list[tuple[str, str]]:
    pairs = [("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
             ("model.norm.weight", "decoder.final_layernorm.weight")]
    if not layout.tie_word_embeddings:
        pairs.append(("lm_head.weight", "output_layer.weight"))
    return pairs


def hf_to_mcore(hf: Mapping[str, torch.Tensor], layout: WeightLayout) -> dict[str, torch.Tensor]:
    """An HF Qwen2/Qwen3/Llama state dict -> GPTModel state dict (every HF tensor used exactly once)."""
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in hf:
            raise KeyError(f"HF state dict lacks {name!r}")
        used.add(name)
        return hf[name]

    out: dict[str, torch.Tensor] = {mc: take(h) for h, mc in _top_pairs(layout)}
    for i in range(layout.num_layers):
        hp, mp = f"model.layers.{i}.", f"decoder.layers.{i}."
        out.update({mc: take(h) for h, mc in _layer_pairs(layout, i)})
        out[mp + "self_attention.linear_qkv.weight"] = pack_qkv(
            *(take(f"{hp}self_attn.{x}_proj.weight") for x in "qkv"), layout)
        if layout.qkv_bias:
            out[mp + "self_attention.linear_qkv.bias"] = pack_qkv(
                *(take(f"{hp}self_attn.{x}_proj.bias") for x in "qkv"), layout)
        out[mp + "mlp.linear_fc1.weight"] = torch.cat(
            [take(hp + "mlp.gate_proj.weight"), take(hp + "mlp.up_proj.weight")], dim=0)
    if layout.tie_word_embeddings and "lm_head.weight" in hf:
        used.add("lm_head.weight")  # the same tensor as the embedding; Megatron stores it once
    left = sorted(set(hf) - used)
    if left:
        raise KeyError(f"HF tensors with no Megatron counterpart: {left[:5]}{' ...' if len(left) > 5 else ''}")
    return out


def mcore_to_hf(mc: Mapping[str, torch.Tensor], layout: WeightLayout) -> dict[str, torch.Tensor]:
    """GPTModel state dict -> HF state dict, with HF's names (lm_head listed when tied, as HF's state dict does)."""
    weights = {k: v for k, v in mc.items() if not k.endswith(EXTRA_STATE_SUFFIX)}
    used: set[str] = set()

    def take(name: str) -> torch.Tensor:
        if name not in weights:
            raise KeyError(f"Megatron state dict lacks {name!r}")
        used.add(name)
        return weights[name]

    out: dict[str, torch.Tensor] = {"model.embed_tokens.weight": take("embedding.word_embeddings.weight")}
    for i in range(layout.num_layers):
        hp, mp = f"model.layers.{i}.", f"decoder.layers.{i}."
        renames = dict(_layer_pairs(layout, i))
        q, k, v = unpack_qkv(take(mp + "self_attention.linear_qkv.weight"), layout)
        out.update({hp + "self_attn.q_proj.weight": q, hp + "self_attn.k_proj.weight": k,
                    hp + "self_attn.v_proj.weight": v})
        if layout.qkv_bias:
            qb, kb, vb = unpack_qkv(take(mp + "self_attention.linear_qkv.bias"), layout)
            out.update({hp + "self_attn.q_proj.bias": qb, hp + "self_attn.k_proj.bias": kb,
                        hp + "self_attn.v_proj.bias": vb})
        out[hp + "self_attn.o_proj.weight"] = take(renames[hp + "self_attn.o_proj.weight"])
        if layout.qk_layernorm:
            out[hp + "self_attn.q_norm.weight"] = take(renames[hp + "self_attn.q_norm.weight"])
            out[hp + "self_attn.k_norm.weight"] = take(renames[hp + "self_attn.k_norm.weight"])
        gate, up = torch.chunk(take(mp + "mlp.linear_fc1.weight"), 2, dim=0)
        out[hp + "mlp.gate_proj.weight"] = gate.contiguous()
        out[hp + "mlp.up_proj.weight"] = up.contiguous()
        out[hp + "mlp.down_proj.weight"] = take(renames[hp + "mlp.down_proj.weight"])
        out[hp + "input_layernorm.weight"] = take(renames[hp + "input_layernorm.weight"])
        out[hp + "post_attention_layernorm.weight"] = take(renames[hp + "post_attention_layernorm.weight"])
    out["model.norm.weight"] = take("decoder.final_layernorm.weight")
    out["lm_head.weight"] = out["model.embed_tokens.weight"] if layout.tie_word_embeddings else take("output_layer.weight")
    left = sorted(set(weights) - used)
    if left:
        raise KeyError(f"Megatron tensors with no HF counterpart: {left[:5]}{' ...' if len(left) > 5 else ''}")
    return out


# ---------------------------------------------------------------------- --megatron-to-hf-mode
Converter = Callable[[Mapping[str, torch.Tensor], WeightLayout], dict[str, torch.Tensor]]


def converters(mode: str) -> tuple[Converter, Converter]:
    """(hf_to_mcore, mcore_to_hf) for ``--megatron-to-hf-mode``."""
    if mode == "raw":
        return hf_to_mcore, mcore_to_hf
    if mode == "bridge":
        if not module_available("megatron.bridge"):
            raise RuntimeError("--megatron-to-hf-mode bridge needs megatron-bridge, which is not installed "
                               "(pip install megatron-bridge), or use --megatron-to-hf-mode raw")
        raise RuntimeError("relax: not supported yet: --megatron-to-hf-mode bridge "
                           "(megatron-bridge is installed but not wired in; use --megatron-to-hf-mode raw)")
    raise ValueError(f"--megatron-to-hf-mode {mode!r}: expected raw or bridge")
