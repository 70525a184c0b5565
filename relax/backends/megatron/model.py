"""Model provider: this rank's part of a megatron-core GPTModel, built from an HF config and the parallel sizes.

The layer spec is the Transformer Engine one when TE is importable (fused norms in the linear
layers, TE attention), else megatron-core's local spec (ColumnParallel / RowParallel linears,
SequentialMLP experts for MoE models) with relax's RMSNorm modules (norms.py: they work under
sequence parallelism) and its core attention swapped for `SdpaCoreAttention` (attention.py: torch
``scaled_dot_product_attention``) instead of megatron's unfused `DotProductAttention`, which
materialises the ``s x s`` scores; ``attention="unfused"`` keeps megatron's module (comparisons,
ci/bench_megatron.py ``--attention unfused``). All compute the same function.

Parallelism (relax/backends/megatron/parallel.py sets up megatron's parallel state first): each
pipeline stage builds its own layers (``pre_process`` / ``post_process`` for the embedding and the
output layer); tensor / expert parallel layers take their shard sizes from the parallel state; the
vocabulary is padded to a multiple of the TP size (sharding.py) and the output layer gathers the
logits over TP (``parallel_output=False``), so the log-probs see full rows. With one stage and TP = 1
this is exactly the model the one-GPU backend built before.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.config import McoreModelSpec
from relax.backends.megatron.layout import WeightLayout
from relax.backends.megatron.parallel import ParallelSizes


def transformer_engine_available() -> bool:
    return module_available("transformer_engine")


@dataclass
class BuiltModel:
    """This rank's bf16 GPTModel (``gpt``), its Float16Module wrapper (``module``), config and weight layout."""

    gpt: Any  # megatron.core.models.gpt.GPTModel
    module: Any  # megatron.core.transformer.module.Float16Module
    config: Any  # megatron.core.transformer.TransformerConfig
    layout: WeightLayout
    vocab_size: int  # the HF vocabulary; the model holds it padded to a multiple of the TP size


ATTENTION_IMPLS = ("sdpa", "unfused")
DEFAULT_ATTENTION = "sdpa"  # core attention of the local spec; ci/bench_megatron.py --attention sets it


def local_layer_spec(qk_layernorm: bool, attention: str = "sdpa", num_experts: int | None = None):
    """megatron-core's local layer spec with relax's norms and ``attention``: "sdpa" (`SdpaCoreAttention`) or
    "unfused" (megatron's `DotProductAttention`) as the self-attention's core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from relax.backends.megatron.norms import HeadRMSNorm, HiddenRMSNorm

    if attention not in ATTENTION_IMPLS:
        raise ValueError(f"attention={attention!r}: choose one of {', '.join(ATTENTION_IMPLS)}")
    layer_spec = get_gpt_layer_local_spec(num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=qk_layernorm,
                                          normalization="RMSNorm")
    sub = layer_spec.submodules
    sub.input_layernorm = sub.pre_mlp_layernorm = HiddenRMSNorm
    attn = sub.self_attention.submodules
    if qk_layernorm:
        attn.q_layernorm = attn.k_layernorm = HeadRMSNorm
    if attention == "sdpa":
        from relax.backends.megatron.attention import SdpaCoreAttention

        attn.core_attention = SdpaCoreAttention
    return layer_spec


def parallel_config_kwargs(sizes: ParallelSizes) -> dict[str, Any]:
    """`TransformerConfig` fields for the parallel sizes, and the loss convention of the schedules.

    ``calculate_per_token_loss``: relax's losses are already divided by the optimizer step's global
    sample (or token) count, so megatron's schedules must not divide them by the number of
    micro-batches, nor its DDP average the gradients over data-parallel ranks (it sums them).
    ``variable_seq_lengths``: micro-batches differ in length, so pipeline stages exchange shapes
    (megatron-core 0.16 also needs the alltoall dispatcher then, even for dense models).
    """
    kwargs: dict[str, Any] = dict(
        tensor_model_parallel_size=sizes.tp, pipeline_model_parallel_size=sizes.pp,
        context_parallel_size=sizes.cp, expert_model_parallel_size=sizes.ep,
        expert_tensor_parallel_size=sizes.etp, sequence_parallel=sizes.sequence_parallel,
        calculate_per_token_loss=True)
    if sizes.pp > 1:
        kwargs.update(variable_seq_lengths=True, moe_token_dispatcher_type="alltoall")
    return kwargs


def core_attention(attention_backend: str | None) -> str:
    """The local spec's core attention for ``--attention-backend``: unfused and local are megatron-core's own
    `DotProductAttention` (its unfused attention), auto and flash relax's `SdpaCoreAttention` (torch SDPA, the
    FlashAttention-2 kernel on CUDA). Under the Transformer Engine spec the value goes to ``TransformerConfig``
    instead (`build_gpt_model`)."""
    return "unfused" if attention_backend in ("unfused", "local") else DEFAULT_ATTENTION


def build_gpt_model(spec: McoreModelSpec, *, sizes: ParallelSizes | None = None, device: str = "cuda",
                    use_te: bool | None = None, attention: str | None = None, attention_backend: str | None = None,
                    extra_config: dict[str, Any] | None = None, provider_path: str | None = None) -> BuiltModel:
    """This rank's bf16 GPTModel, uninitialised (weights come from the HF checkpoint, weights.py).

    ``attention`` ("sdpa" / "unfused") picks the local spec's core attention; without it ``attention_backend``
    (``--attention-backend``, `core_attention`) does, default `DEFAULT_ATTENTION`. The TE spec brings its own
    attention, whose kernel ``attention_backend`` picks through ``TransformerConfig.attention_backend`` as in
    Megatron-LM. ``extra_config``: more `TransformerConfig` fields (the
    trainer's activation recompute, `memory_flags.recompute_kwargs`, and the fusions). ``provider_path``:
    ``--custom-model-provider-path``, Megatron-LM's ``model_provider`` that builds the GPTModel from this config
    in place of relax's layer spec (relax/models/provider.py); its names are checked when the weights load.
    """
    import torch.nn.functional as F
    from megatron.core import parallel_state as ps
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.transformer_block import (
        TransformerBlockSubmodules,
        get_num_layers_to_build,
    )

    from relax.backends.megatron.norms import HiddenRMSNorm

    use_te = transformer_engine_available() if use_te is None else use_te
    sizes = sizes or ParallelSizes()
    if (extra_config or {}).get("apply_rope_fusion"):
        from relax.backends.megatron.rope_fusion import install

        install()  # before the config is built: its checks look for a fused RoPE (TE's, else relax's)
    te_choice = {}
    if use_te and attention_backend:  # TE's attention reads it (megatron sets NVTE_*_ATTN from it)
        from megatron.core.transformer.enums import AttnBackend

        te_choice = {"attention_backend": AttnBackend[attention_backend]}
    config = TransformerConfig(
        **{**spec.transformer_config_kwargs(), **parallel_config_kwargs(sizes)}, **te_choice,
        activation_func=F.silu,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        perform_initialization=False,
        **(extra_config or {}),
    )
    experts = spec.num_experts or None
    if use_te:
        layer_spec = get_gpt_layer_with_transformer_engine_spec(num_experts=experts, moe_grouped_gemm=False,
                                                                qk_layernorm=spec.qk_layernorm)
    else:
        layer_spec = TransformerBlockSubmodules(
            layer_specs=[local_layer_spec(spec.qk_layernorm, attention or core_attention(attention_backend), experts)]
            * get_num_layers_to_build(config), layer_norm=HiddenRMSNorm)
    vocab = sizes.layout.padded_vocab(spec.vocab_size)
    kwargs = {**spec.gpt_model_kwargs(), "vocab_size": vocab}
    if provider_path:
        from relax.models.provider import call_megatron_provider

        gpt = call_megatron_provider(provider_path, pre_process=ps.is_pipeline_first_stage(),
                                     post_process=ps.is_pipeline_last_stage(), config=config)
    else:
        gpt = GPTModel(config=config, transformer_layer_spec=layer_spec, pre_process=ps.is_pipeline_first_stage(),
                       post_process=ps.is_pipeline_last_stage(), parallel_output=False, **kwargs)
    _tag_tensor_parallel_params(gpt)
    gpt.to(_device(device))  # the local spec's torch.nn.RMSNorm is created on the default device
    module = Float16Module(config, gpt)
    return BuiltModel(gpt, module, config, WeightLayout.from_spec(spec, fused_norms=use_te), spec.vocab_size)


def _tag_tensor_parallel_params(gpt) -> None:
    """Mark tensor-parallel weights as such where megatron-core did not (0.16 skips it without initialisation).

    megatron-core counts a parameter without ``tensor_model_parallel`` as a copy held by every TP rank
    (its gradient norm takes it from TP rank 0 only). Its parallel layers set the attribute while
    initialising their weights; megatron-core 0.19 also sets it with ``perform_initialization=False``
    (how relax builds, the weights come from the checkpoint), 0.16 does not, which under TP dropped
    the other ranks' shards from the norm (clipping by too small a norm). Same attributes as megatron's.
    """
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    dims = ((ColumnParallelLinear, "weight", 0), (ColumnParallelLinear, "bias", 0), (RowParallelLinear, "weight", 1),
            (VocabParallelEmbedding, "weight", 0))
    for module in gpt.modules():
        for cls, name, dim in dims:
            param = getattr(module, name, None) if isinstance(module, cls) else None
            if isinstance(param, torch.nn.Parameter) and not hasattr(param, "tensor_model_parallel"):
                set_tensor_model_parallel_attributes(param, is_parallel=True, dim=dim, stride=1)


def _device(device: str) -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if device == "cuda" else torch.device(device)
