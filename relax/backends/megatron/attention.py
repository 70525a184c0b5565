"""Core attention through torch's ``scaled_dot_product_attention``, for megatron-core's local layer spec.

Why it exists: without Transformer Engine, megatron-core's local spec computes core attention with
`DotProductAttention`: ``baddbmm`` into a ``[b * heads, s, s]`` score buffer, a masked softmax, then
``bmm`` with V (and K/V repeated to every query head under GQA). Every layer writes and reads the
full score matrix in HBM, which is most of why the local spec measured 17% MFU on a 1B model at
sequence 2048 on an H100 (docs/performance.md). `SdpaCoreAttention` is a drop-in for that module
(the same constructor and forward signature, megatron-core 0.16 and 0.19) that calls
``torch.nn.functional.scaled_dot_product_attention(..., is_causal=True, enable_gqa=True)``: on CUDA
in bf16/fp16 torch dispatches to its FlashAttention-2 kernel, which never materialises the scores,
computes the softmax in fp32 and reads the K/V groups without repeating them (inputs flash cannot
take get K/V repeated, as megatron does, for the memory-efficient kernel: `native_gqa`).

Scope: exactly what relax's Megatron forward asks for (logprobs.py): causal self-attention with
``attention_mask=None`` (right padding sits after every real token, so under the causal mask it
never changes a real token's output), no attention dropout, vanilla softmax, no sliding window, no
packed sequences, no attention bias, no context parallelism. Anything else is refused in one line
(`build_gpt_model(..., attention="unfused")` builds megatron's own module). Tensor parallelism
needs nothing: like `DotProductAttention`, the module sees only its partition's heads.

Scale: ``softmax_scale`` (``TransformerConfig.softmax_scale``) when set, else ``1 / sqrt(kv_channels)``,
as `DotProductAttention` does. ``apply_query_key_layer_scaling`` does not change it: megatron divides
the scale by the layer number before the QK^T matmul and multiplies the scores back by it inside the
fp32 softmax (an fp16 overflow guard), so the effective scale is the same; the flash kernel keeps
the scores in fp32 anyway.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.utils import is_layer_window_attention

# enable_gqa arrived in torch 2.5; older versions get K/V repeated per query head (as megatron does)
_NATIVE_GQA = tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def native_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> bool:
    """Whether to pass ``enable_gqa`` rather than repeat K/V: on CUDA only the flash kernel (and the
    math fallback) takes GQA natively, so inputs flash cannot run (fp32, head_dim > 256, pre-Ampere
    GPUs) get K/V repeated, which lets the memory-efficient kernel take them instead of math."""
    if not _NATIVE_GQA:
        return False
    if not q.is_cuda:
        return True
    try:
        params = torch.backends.cuda.SDPAParams(q, k, v, None, 0.0, True, True)  # mask, dropout, causal, gqa
        return torch.backends.cuda.can_use_flash_attention(params)
    except (AttributeError, TypeError, RuntimeError):
        return q.dtype in (torch.float16, torch.bfloat16)


class UnsupportedAttentionError(NotImplementedError):
    """Asked for an attention variant that `SdpaCoreAttention` does not compute."""


def _refuse(condition: object, what: str) -> None:
    if condition:
        raise UnsupportedAttentionError(
            f"SdpaCoreAttention computes causal self-attention only, not {what} "
            "(build_gpt_model(..., attention='unfused') builds megatron's DotProductAttention)")


def causal_sdpa(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, scale: float) -> torch.Tensor:
    """Causal softmax(Q K^T * scale) V in Megatron's layout.

    query ``[s, b, np, hn]``, key/value ``[s, b, ng, hn]`` with ``np`` a multiple of ``ng`` (query
    head ``i`` reads K/V group ``i // (np / ng)``, as megatron's ``repeat_interleave``); returns
    ``[s, b, np * hn]``.
    """
    sq, b, heads, hn = query.shape
    sk, groups = key.size(0), key.size(2)
    _refuse(sk != sq, f"queries and keys of different lengths ({sq} vs {sk}: KV-cache inference)")
    if key.shape != value.shape or key.shape[1] != b or key.shape[3] != hn or heads % groups:
        raise ValueError(f"causal_sdpa: query {tuple(query.shape)}, key {tuple(key.shape)}, value "
                         f"{tuple(value.shape)}: need [s, b, np, hn] and [s, b, ng, hn] with ng dividing np")
    q, k, v = (t.permute(1, 2, 0, 3) for t in (query, key, value))  # [b, heads, s, hn] views
    gqa = {}
    if groups != heads:
        if native_gqa(q, k, v):
            gqa["enable_gqa"] = True
        else:
            k, v = (t.repeat_interleave(heads // groups, dim=1) for t in (k, v))
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale, **gqa)  # [b, np, s, hn]
    return out.permute(2, 0, 1, 3).reshape(sq, b, heads * hn)


def _tp_size(pg_collection) -> int:
    tp = getattr(pg_collection, "tp", None) if pg_collection is not None else None
    if tp is not None:
        return tp.size()
    from megatron.core import parallel_state

    return parallel_state.get_tensor_model_parallel_world_size()


class SdpaCoreAttention(MegatronModule):
    """``core_attention`` of megatron-core's `SelfAttention` through torch SDPA (see the module docstring)."""

    def __init__(self, config, layer_number: int, attn_mask_type: AttnMaskType, attention_type: str,
                 attention_dropout: float | None = None, softmax_scale: float | None = None,
                 cp_comm_type: str | None = None, pg_collection=None):
        super().__init__(config=config)
        dropout = config.attention_dropout if attention_dropout is None else attention_dropout
        _refuse(attention_type != "self", f"attention_type={attention_type!r}")
        _refuse(attn_mask_type != AttnMaskType.causal, f"attn_mask_type={attn_mask_type}")
        _refuse(dropout, f"attention dropout {dropout}")
        _refuse(config.context_parallel_size != 1, f"context parallelism (size {config.context_parallel_size})")
        _refuse(getattr(config, "softmax_type", "vanilla") != "vanilla", f"softmax_type={config.softmax_type!r}")
        _refuse(is_layer_window_attention(config.window_size, config.window_attn_skip_freq, max(1, layer_number)),
                f"sliding-window attention (window_size={config.window_size})")
        tp = _tp_size(pg_collection)
        if config.num_attention_heads % tp or config.num_query_groups % tp:
            raise ValueError(f"SdpaCoreAttention: {config.num_attention_heads} heads / {config.num_query_groups} "
                             f"query groups do not split over tensor-parallel size {tp}")
        self.layer_number = max(1, layer_number)
        self.attn_mask_type = attn_mask_type
        self.attention_type = attention_type
        self.num_attention_heads_per_partition = config.num_attention_heads // tp
        self.num_query_groups_per_partition = config.num_query_groups // tp
        self.hidden_size_per_partition = config.kv_channels * self.num_attention_heads_per_partition
        self.softmax_scale = 1.0 / math.sqrt(config.kv_channels) if softmax_scale is None else softmax_scale

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                attention_mask: torch.Tensor | None, attn_mask_type: AttnMaskType | None = None,
                attention_bias: torch.Tensor | None = None, packed_seq_params=None) -> torch.Tensor:
        """query ``[sq, b, np, hn]``, key/value ``[sk, b, ng, hn]`` -> ``[sq, b, np * hn]``."""
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        _refuse(mask_type != AttnMaskType.causal, f"attn_mask_type={mask_type}")
        _refuse(attention_mask is not None, "an explicit attention_mask (pass None: the causal mask is implied)")
        _refuse(attention_bias is not None, "an attention bias")
        _refuse(packed_seq_params is not None, "packed sequences (packed_seq_params)")
        if (query.size(2), key.size(2)) != (self.num_attention_heads_per_partition,
                                            self.num_query_groups_per_partition):
            raise ValueError(f"SdpaCoreAttention: got {query.size(2)} query / {key.size(2)} key heads, configured "
                             f"{self.num_attention_heads_per_partition} / {self.num_query_groups_per_partition}")
        return causal_sdpa(query, key, value, self.softmax_scale)
