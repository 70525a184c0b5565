"""Model provider: megatron-core GPTModel from an HF config, plus the single-process parallel state.

The layer spec is the Transformer Engine one when TE is importable (fused norms in the
linear layers, TE attention), else megatron-core's local spec (torch RMSNorm, ColumnParallel /
RowParallel linears) with its core attention swapped for `SdpaCoreAttention` (attention.py: torch
``scaled_dot_product_attention``, flash kernels on CUDA) instead of megatron's unfused
`DotProductAttention`, which materialises the ``s x s`` scores; ``attention="unfused"`` keeps
megatron's module (comparisons, ci/bench_megatron.py ``--attention unfused``). All compute the
same function; the raw weight converter knows both naming schemes (`WeightLayout.fused_norms`).

Megatron needs torch.distributed and its model-parallel groups even on one GPU:
`init_parallel_state` creates a world of one (NCCL) and TP = PP = 1. Larger parallel sizes
are refused at flag parsing (``not supported yet: --tensor-model-parallel-size``).
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

import torch

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.config import McoreModelSpec
from relax.backends.megatron.convert import WeightLayout


def transformer_engine_available() -> bool:
    return module_available("transformer_engine")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel_state(seed: int) -> None:
    """A one-process NCCL world with TP = PP = 1 (idempotent), and Megatron's CUDA RNG tracker."""
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if not torch.cuda.is_available():
        raise RuntimeError("the Megatron backend needs a CUDA GPU: megatron-core does not run on CPU "
                           "(use --train-backend torch)")
    torch.cuda.set_device(torch.cuda.current_device())
    if not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(_free_port()))
        dist.init_process_group("nccl", rank=0, world_size=1)
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(tensor_model_parallel_size=1, pipeline_model_parallel_size=1)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


@dataclass
class BuiltModel:
    """The bf16 GPTModel (``gpt``), its Float16Module wrapper (``module``) and its weight layout."""

    gpt: Any  # megatron.core.models.gpt.GPTModel
    module: Any  # megatron.core.transformer.module.Float16Module
    config: Any  # megatron.core.transformer.TransformerConfig
    layout: WeightLayout


ATTENTION_IMPLS = ("sdpa", "unfused")
DEFAULT_ATTENTION = "sdpa"  # core attention of the local spec; ci/bench_megatron.py --attention sets it


def local_layer_spec(qk_layernorm: bool, attention: str = "sdpa"):
    """megatron-core's local layer spec (RMSNorm) with ``attention``: "sdpa" (`SdpaCoreAttention`) or
    "unfused" (megatron's `DotProductAttention`) as the self-attention's core attention."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    if attention not in ATTENTION_IMPLS:
        raise ValueError(f"attention={attention!r}: choose one of {', '.join(ATTENTION_IMPLS)}")
    layer_spec = get_gpt_layer_local_spec(qk_layernorm=qk_layernorm, normalization="RMSNorm")
    if attention == "sdpa":
        from relax.backends.megatron.attention import SdpaCoreAttention

        layer_spec.submodules.self_attention.submodules.core_attention = SdpaCoreAttention
    return layer_spec


def build_gpt_model(spec: McoreModelSpec, *, use_te: bool | None = None,
                    attention: str | None = None, extra_config: dict[str, Any] | None = None) -> BuiltModel:
    """A bf16 GPTModel on the current CUDA device, uninitialised (weights come from the HF checkpoint).

    ``attention`` ("sdpa" / "unfused", default `DEFAULT_ATTENTION`) picks the local spec's core attention;
    the TE spec brings its own fused attention. ``extra_config``: more `TransformerConfig` fields (the
    trainer's activation recompute, `memory_flags.recompute_kwargs`).
    """
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_with_transformer_engine_spec
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.module import Float16Module

    use_te = transformer_engine_available() if use_te is None else use_te
    config = TransformerConfig(
        **spec.transformer_config_kwargs(),
        activation_func=F.silu,
        bf16=True,
        params_dtype=torch.bfloat16,
        pipeline_dtype=torch.bfloat16,
        perform_initialization=False,
        **(extra_config or {}),
    )
    if use_te:
        layer_spec = get_gpt_layer_with_transformer_engine_spec(qk_layernorm=spec.qk_layernorm)
    else:
        layer_spec = local_layer_spec(spec.qk_layernorm, DEFAULT_ATTENTION if attention is None else attention)
    gpt = GPTModel(config=config, transformer_layer_spec=layer_spec, pre_process=True, post_process=True,
                   **spec.gpt_model_kwargs())
    gpt.cuda(torch.cuda.current_device())  # the local spec's torch.nn.RMSNorm is created on the default device
    module = Float16Module(config, gpt)
    return BuiltModel(gpt, module, config, WeightLayout.from_spec(spec, fused_norms=use_te))
