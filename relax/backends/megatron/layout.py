"""Which megatron-core parameter each HF tensor becomes: the catalogue both converters and the sharding use.

Pure torch (no megatron import), so it runs and is tested on CPU. `catalogue` lists, for a model
shape (`WeightLayout`), every megatron-core parameter under its *global* name (global layer and
expert indices), the HF checkpoint tensors it is built from and how tensor parallelism splits it
(`Split`). `combine` / `separate` turn HF tensors into the full (unsharded) megatron tensor and
back with reshapes and concatenations only, so every round trip is bitwise exact.

HF names are the checkpoint's (safetensors) names. For MoE models they are one tensor per expert
(``mlp.experts.{e}.gate_proj.weight`` for Qwen3-MoE, ``block_sparse_moe.experts.{e}.w1.weight`` for
Mixtral), which is what SGLang and HF checkpoints hold; transformers >= 5 fuses experts in memory
(relax/backends/megatron/hf_source.py maps between the two).

Megatron layouts:

- ``linear_qkv`` is grouped per key/value head: for each of the ``g`` query groups, its ``h/g``
  query heads, then its key head, then its value head, ``head_dim`` rows each. Tensor parallelism
  gives each rank whole groups, a contiguous row range.
- ``linear_fc1`` of a SwiGLU MLP (and of each expert) is ``[gate; up]``; tensor parallelism gives
  rank ``r`` ``[gate_r; up_r]``, not a contiguous range of the fused tensor.
- The Transformer Engine layer spec (``fused_norms``) keeps the pre-attention and pre-MLP RMSNorm
  weights inside ``linear_qkv`` / ``linear_fc1`` (MoE layers keep ``pre_mlp_layernorm``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

import torch

from relax.models.checkpoint_names import EXPERT_NAMES

EXTRA_STATE_SUFFIX = "_extra_state"  # Transformer Engine's per-module metadata: not a weight


class Split(Enum):
    """How tensor parallelism (expert tensor parallelism for experts) splits a parameter."""

    REPLICATED = "replicated"  # norms, router: every rank holds all of it
    ROW = "row"  # RowParallelLinear (linear_proj, linear_fc2): columns split
    QKV = "qkv"  # ColumnParallelLinear over the grouped qkv: whole query groups per rank
    GLU = "glu"  # ColumnParallelLinear over [gate; up]: rank r holds [gate_r; up_r]
    VOCAB = "vocab"  # vocab-parallel embedding / output layer: rows of the padded vocabulary


@dataclass(frozen=True)
class WeightLayout:
    """The shape of a model, as far as weight names and packing are concerned."""

    num_layers: int
    num_heads: int
    num_query_groups: int
    head_dim: int
    qk_layernorm: bool
    qkv_bias: bool
    tie_word_embeddings: bool
    fused_norms: bool = False  # Transformer Engine layer spec
    num_experts: int = 0  # 0: dense MLP
    moe_style: str = ""  # "qwen3_moe" or "mixtral": the HF names of the experts and router

    @classmethod
    def from_spec(cls, spec, *, fused_norms: bool = False) -> WeightLayout:
        """From a `relax.backends.megatron.config.McoreModelSpec`."""
        return cls(spec.num_layers, spec.num_attention_heads, spec.num_query_groups, spec.kv_channels,
                   spec.qk_layernorm, spec.add_qkv_bias, spec.tie_word_embeddings, fused_norms,
                   spec.num_experts, spec.model_type if spec.num_experts else "")

    @property
    def heads_per_group(self) -> int:
        return self.num_heads // self.num_query_groups

    def norm_names(self, layer: int) -> tuple[str, str]:
        p = f"decoder.layers.{layer}."
        attn = p + ("self_attention.linear_qkv.layer_norm_weight" if self.fused_norms else "input_layernorm.weight")
        fused_mlp = self.fused_norms and not self.num_experts
        return attn, p + ("mlp.linear_fc1.layer_norm_weight" if fused_mlp else "pre_mlp_layernorm.weight")


@dataclass(frozen=True)
class Param:
    """One megatron-core parameter: global name, its HF sources (in packing order) and its split."""

    name: str
    hf: tuple[str, ...]
    split: Split
    layer: int | None = None  # global layer index (None: embedding, final norm, output layer)
    expert: int | None = None  # global expert index (experts are split by EP and expert TP)
    hf_aliases: tuple[str, ...] = ()  # more HF names that get this same tensor on export (tied lm_head)
    load_only: bool = False  # the tied output layer of the last pipeline stage: loaded, never exported

    @property
    def is_expert(self) -> bool:
        return self.expert is not None

    def hf_names(self) -> tuple[str, ...]:
        return self.hf + self.hf_aliases


# ---------------------------------------------------------------------- the catalogue
def _attention(layout: WeightLayout, i: int) -> list[Param]:
    hf, mc = f"model.layers.{i}.self_attn.", f"decoder.layers.{i}.self_attention."
    out = [Param(mc + "linear_qkv.weight", tuple(f"{hf}{x}_proj.weight" for x in "qkv"), Split.QKV, i)]
    if layout.qkv_bias:
        out.append(Param(mc + "linear_qkv.bias", tuple(f"{hf}{x}_proj.bias" for x in "qkv"), Split.QKV, i))
    out.append(Param(mc + "linear_proj.weight", (hf + "o_proj.weight",), Split.ROW, i))
    if layout.qk_layernorm:
        out += [Param(mc + "q_layernorm.weight", (hf + "q_norm.weight",), Split.REPLICATED, i),
                Param(mc + "k_layernorm.weight", (hf + "k_norm.weight",), Split.REPLICATED, i)]
    return out


def _mlp(layout: WeightLayout, i: int) -> list[Param]:
    hp, mp = f"model.layers.{i}.", f"decoder.layers.{i}.mlp."
    if not layout.num_experts:
        return [Param(mp + "linear_fc1.weight", (hp + "mlp.gate_proj.weight", hp + "mlp.up_proj.weight"), Split.GLU, i),
                Param(mp + "linear_fc2.weight", (hp + "mlp.down_proj.weight",), Split.ROW, i)]
    block, gate, up, down = EXPERT_NAMES[layout.moe_style]
    out = [Param(mp + "router.weight", (f"{hp}{block}.gate.weight",), Split.REPLICATED, i)]
    for e in range(layout.num_experts):
        he, me = f"{hp}{block}.experts.{e}.", f"{mp}experts.local_experts.{e}."
        out += [Param(me + "linear_fc1.weight", (f"{he}{gate}.weight", f"{he}{up}.weight"), Split.GLU, i, e),
                Param(me + "linear_fc2.weight", (f"{he}{down}.weight",), Split.ROW, i, e)]
    return out


def catalogue(layout: WeightLayout, *, pipeline_parallel: int = 1) -> list[Param]:
    """Every megatron-core parameter of the model, in export order (embedding, layers, final norm, output).

    With tied embeddings and more than one pipeline stage the last stage holds its own copy of the
    embedding as ``output_layer.weight`` (megatron keeps the two equal by all-reducing their
    gradients): it is listed ``load_only``, loaded from the HF embedding and never exported.
    """
    if layout.num_experts and layout.moe_style not in EXPERT_NAMES:
        raise ValueError(f"unknown MoE naming {layout.moe_style!r}; known: {', '.join(EXPERT_NAMES)}")
    tied = layout.tie_word_embeddings
    out = [Param("embedding.word_embeddings.weight", ("model.embed_tokens.weight",), Split.VOCAB,
                 hf_aliases=("lm_head.weight",) if tied else ())]
    for i in range(layout.num_layers):
        attn_norm, mlp_norm = layout.norm_names(i)
        out.append(Param(attn_norm, (f"model.layers.{i}.input_layernorm.weight",), Split.REPLICATED, i))
        out += _attention(layout, i)
        out.append(Param(mlp_norm, (f"model.layers.{i}.post_attention_layernorm.weight",), Split.REPLICATED, i))
        out += _mlp(layout, i)
    out.append(Param("decoder.final_layernorm.weight", ("model.norm.weight",), Split.REPLICATED))
    if not tied:
        out.append(Param("output_layer.weight", ("lm_head.weight",), Split.VOCAB))
    elif pipeline_parallel > 1:
        out.append(Param("output_layer.weight", ("model.embed_tokens.weight",), Split.VOCAB, load_only=True))
    return out


# ---------------------------------------------------------------------- HF tensors <-> full megatron tensors
def pack_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, groups: int, heads_per_group: int) -> torch.Tensor:
    """HF q/k/v (weights ``[n*d, H]`` or biases ``[n*d]``) of ``groups`` query groups -> the grouped ``linear_qkv``."""
    d = k.shape[0] // groups
    rest = q.shape[1:]
    fused = torch.cat([q.reshape(groups, heads_per_group * d, *rest), k.reshape(groups, d, *rest),
                       v.reshape(groups, d, *rest)], dim=1)
    return fused.reshape(groups * (heads_per_group + 2) * d, *rest)


def unpack_qkv(qkv: torch.Tensor, groups: int, heads_per_group: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = qkv.shape[0] // (groups * (heads_per_group + 2))
    rest = qkv.shape[1:]
    q, k, v = torch.split(qkv.reshape(groups, (heads_per_group + 2) * d, *rest), [heads_per_group * d, d, d], dim=1)
    return (q.reshape(groups * heads_per_group * d, *rest).contiguous(), k.reshape(groups * d, *rest).contiguous(),
            v.reshape(groups * d, *rest).contiguous())


def combine(param: Param, tensors: Sequence[torch.Tensor], layout: WeightLayout) -> torch.Tensor:
    """The full megatron tensor of ``param`` from its HF tensors (in ``param.hf`` order)."""
    if param.split is Split.QKV:
        return pack_qkv(*tensors, layout.num_query_groups, layout.heads_per_group)
    if param.split is Split.GLU:
        return torch.cat(list(tensors), dim=0)
    (tensor,) = tensors
    return tensor


def separate(param: Param, full: torch.Tensor, layout: WeightLayout) -> list[tuple[str, torch.Tensor]]:
    """Inverse of `combine`: ``(hf_name, tensor)`` pairs, aliases (tied lm_head) included."""
    if param.split is Split.QKV:
        parts = unpack_qkv(full, layout.num_query_groups, layout.heads_per_group)
    elif param.split is Split.GLU:
        parts = tuple(t.contiguous() for t in torch.chunk(full, 2, dim=0))
    else:
        parts = (full,)
    named = list(zip(param.hf, parts, strict=True))
    return named + [(alias, full) for alias in param.hf_aliases]
