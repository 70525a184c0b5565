"""`SdpaCoreAttention` (relax/backends/megatron/attention.py) on CPU.

The math (`causal_sdpa`) against an explicit float64 causal softmax(Q K^T * scale) V with the
GQA head mapping written out, the module's scale/head bookkeeping and its one-line refusals,
megatron's own `DotProductAttention` on the same inputs, and a real GPTModel built with the SDPA
local spec against the HF model (the CPU megatron world of tests/test_megatron_convert.py).
The flash-kernel path, bf16 and the speed are checked on a GPU (tests/gpu/test_megatron_attention_gpu.py).
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("megatron.core", reason="megatron-core is not installed")

from megatron.core.transformer import TransformerConfig  # noqa: E402
from megatron.core.transformer.enums import AttnMaskType  # noqa: E402

from relax.backends.megatron.attention import (  # noqa: E402
    SdpaCoreAttention,
    UnsupportedAttentionError,
    causal_sdpa,
)
from tests.test_megatron_convert import FAMILIES, cpu_megatron  # noqa: E402,F401 - the CPU megatron world


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    """float64, one head at a time: query head i reads K/V group i // (np / ng)."""
    s, b, heads, hn = q.shape
    ratio = heads // k.shape[2]
    q, k, v = q.double(), k.double(), v.double()
    future = torch.ones(s, s, dtype=torch.bool).triu(1)
    out = torch.empty(s, b, heads, hn, dtype=torch.float64)
    for i in range(heads):
        qi, ki, vi = q[:, :, i].transpose(0, 1), k[:, :, i // ratio].transpose(0, 1), v[:, :, i // ratio].transpose(0, 1)
        scores = (qi @ ki.transpose(1, 2) * scale).masked_fill(future, -math.inf)  # [b, s, s]
        out[:, :, i] = (scores.softmax(-1) @ vi).transpose(0, 1)
    return out.reshape(s, b, heads * hn)


def qkv(s: int, b: int, groups: int, ratio: int, hn: int, dtype=torch.float64, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(s, b, groups * ratio, hn, generator=g, dtype=dtype)
    k = torch.randn(s, b, groups, hn, generator=g, dtype=dtype)
    v = torch.randn(s, b, groups, hn, generator=g, dtype=dtype)
    return q, k, v


@settings(max_examples=30, deadline=None)
@given(s=st.integers(1, 37), b=st.integers(1, 3), groups=st.integers(1, 3), ratio=st.sampled_from([1, 2, 4]),
       hn=st.sampled_from([4, 8, 16]), scale=st.one_of(st.none(), st.floats(0.05, 2.0)), seed=st.integers(0, 99))
def test_causal_sdpa_matches_float64_reference(s, b, groups, ratio, hn, scale, seed) -> None:
    scale = 1 / math.sqrt(hn) if scale is None else scale
    q, k, v = qkv(s, b, groups, ratio, hn, seed=seed)
    ref = reference(q, k, v, scale)
    out = causal_sdpa(q, k, v, scale)
    assert out.shape == (s, b, groups * ratio * hn) and out.dtype == torch.float64
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-10)
    out32 = causal_sdpa(q.float(), k.float(), v.float(), scale)
    assert out32.dtype == torch.float32
    torch.testing.assert_close(out32.double(), ref, rtol=0, atol=2e-5)


@pytest.mark.parametrize("s", [1, 2, 7, 33])
def test_causal_sdpa_on_megatron_views(s: int) -> None:
    """Megatron hands over q/k/v as views into one projection output (non-contiguous heads)."""
    b, groups, ratio, hn = 2, 2, 4, 8
    mixed = torch.randn(s, b, groups, ratio + 2, hn, dtype=torch.float64, generator=torch.Generator().manual_seed(s))
    q = mixed[:, :, :, :ratio].reshape(s, b, groups * ratio, hn)
    k, v = mixed[:, :, :, ratio], mixed[:, :, :, ratio + 1]
    assert not k.is_contiguous()
    torch.testing.assert_close(causal_sdpa(q, k, v, 0.3), reference(q, k, v, 0.3), rtol=0, atol=1e-10)


def test_causal_sdpa_repeats_kv_where_gqa_is_not_native(monkeypatch) -> None:
    """Inputs the flash kernel cannot take (or torch < 2.5) get K/V repeated per query head instead."""
    q, k, v = qkv(9, 2, 2, 4, 8)
    native = causal_sdpa(q, k, v, 0.4)
    monkeypatch.setattr("relax.backends.megatron.attention.native_gqa", lambda *a: False)
    torch.testing.assert_close(causal_sdpa(q, k, v, 0.4), native, rtol=0, atol=1e-12)
    torch.testing.assert_close(native, reference(q, k, v, 0.4), rtol=0, atol=1e-10)


def test_causal_sdpa_refuses_bad_shapes() -> None:
    q, k, v = qkv(5, 1, 3, 1, 4)
    with pytest.raises(ValueError, match="ng dividing np"):
        causal_sdpa(q[:, :, :2], k, v, 1.0)  # 2 query heads over 3 groups
    with pytest.raises(UnsupportedAttentionError, match="different lengths"):
        causal_sdpa(q[:3], k, v, 1.0)


# ---------------------------------------------------------------------- the megatron module
def _config(heads: int = 8, groups: int = 4, hn: int = 16, **kw) -> TransformerConfig:
    return TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=heads, num_query_groups=groups,
                             kv_channels=hn, attention_dropout=0.0, hidden_dropout=0.0, **kw)


def _tp(size: int) -> SimpleNamespace:
    return SimpleNamespace(tp=SimpleNamespace(size=lambda: size))


def _module(config: TransformerConfig, tp: int = 1, **kw) -> SdpaCoreAttention:
    args = dict(config=config, layer_number=1, attn_mask_type=AttnMaskType.causal, attention_type="self",
                softmax_scale=config.softmax_scale, cp_comm_type=None, pg_collection=_tp(tp)) | kw
    return SdpaCoreAttention(**args)


@pytest.mark.parametrize("tp", [1, 2])
@pytest.mark.parametrize("softmax_scale", [None, 0.2])
def test_module_uses_local_heads_and_megatron_scale(tp: int, softmax_scale: float | None) -> None:
    config = _config(softmax_scale=softmax_scale)
    mod = _module(config, tp=tp)
    assert (mod.num_attention_heads_per_partition, mod.num_query_groups_per_partition) == (8 // tp, 4 // tp)
    scale = 1 / math.sqrt(16) if softmax_scale is None else softmax_scale
    assert mod.softmax_scale == scale
    q, k, v = qkv(9, 2, 4 // tp, 2, 16, dtype=torch.float32)
    out = mod(q, k, v, None, attn_mask_type=AttnMaskType.causal, attention_bias=None, packed_seq_params=None)
    assert out.shape == (9, 2, mod.hidden_size_per_partition)
    torch.testing.assert_close(out.double(), reference(q, k, v, scale), rtol=0, atol=2e-5)
    with pytest.raises(ValueError, match="query / .* key heads"):
        mod(q, q, q, None)


def test_layer_scaling_does_not_change_the_scale() -> None:
    """megatron divides the scale by the layer number and multiplies the scores back inside the softmax."""
    mod = _module(_config(apply_query_key_layer_scaling=True, bf16=True), layer_number=3)
    assert mod.softmax_scale == 1 / math.sqrt(16)


@pytest.mark.parametrize(("kw", "config_kw", "match"), [
    ({"attn_mask_type": AttnMaskType.padding}, {}, "attn_mask_type=AttnMaskType.padding"),
    ({"attention_type": "cross"}, {}, "attention_type='cross'"),
    ({"attention_dropout": 0.1}, {}, "attention dropout 0.1"),
    ({}, {"attention_dropout": 0.1}, "attention dropout 0.1"),
    ({}, {"softmax_type": "off-by-one"}, "softmax_type='off-by-one'"),
    ({}, {"window_size": (16, 0)}, "sliding-window"),
])
def test_module_refuses_what_it_does_not_compute(kw, config_kw, match) -> None:
    base = dict(attention_dropout=0.0) | config_kw
    config = TransformerConfig(num_layers=4, hidden_size=64, num_attention_heads=8, num_query_groups=4,
                               kv_channels=16, hidden_dropout=0.0, **base)
    with pytest.raises(UnsupportedAttentionError, match=match) as err:
        _module(config, **kw)
    assert "\n" not in str(err.value) and "attention='unfused'" in str(err.value)


def test_module_refuses_heads_that_do_not_split_over_tp() -> None:
    with pytest.raises(ValueError, match="tensor-parallel size 3"):
        _module(_config(), tp=3)


@pytest.mark.parametrize(("call_kw", "match"), [
    ({"attention_mask": torch.zeros(1, 1, 5, 5, dtype=torch.bool)}, "explicit attention_mask"),
    ({"attn_mask_type": AttnMaskType.padding_causal}, "attn_mask_type=AttnMaskType.padding_causal"),
    ({"attention_bias": torch.zeros(1, 8, 5, 5)}, "attention bias"),
    ({"packed_seq_params": object()}, "packed sequences"),
])
def test_forward_refuses_masks_biases_and_packing(call_kw, match) -> None:
    mod = _module(_config())
    q, k, v = qkv(5, 1, 4, 2, 16, dtype=torch.float32)
    kw = dict(attention_mask=None) | call_kw
    with pytest.raises(UnsupportedAttentionError, match=match):
        mod(q, k, v, kw.pop("attention_mask"), **kw)


@pytest.mark.megatron
@pytest.mark.usefixtures("cpu_megatron")
@pytest.mark.parametrize(("ratio", "layer_scaling", "softmax_scale"), [(1, False, None), (2, True, None), (4, False, 0.3)])
def test_module_matches_megatron_dot_product_attention(ratio, layer_scaling, softmax_scale) -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    config = _config(heads=2 * ratio, groups=2, softmax_scale=softmax_scale,
                     apply_query_key_layer_scaling=layer_scaling, masked_softmax_fusion=False)
    args = dict(config=config, layer_number=3, attn_mask_type=AttnMaskType.causal, attention_type="self",
                softmax_scale=softmax_scale, cp_comm_type=None, pg_collection=_tp(1))
    ours, theirs = SdpaCoreAttention(**args), DotProductAttention(**args)
    q, k, v = qkv(11, 2, 2, ratio, 16, dtype=torch.float32, seed=ratio)
    causal = torch.ones(11, 11, dtype=torch.bool).triu(1)[None, None]
    with torch.no_grad():
        torch.testing.assert_close(ours(q, k, v, None), theirs(q, k, v, causal), rtol=0, atol=1e-5)


# ---------------------------------------------------------------------- GPTModel with the SDPA spec
def test_local_layer_spec_swaps_only_the_core_attention() -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from relax.backends.megatron.model import local_layer_spec

    sdpa, unfused = local_layer_spec(True, "sdpa"), local_layer_spec(True, "unfused")
    assert sdpa.submodules.self_attention.submodules.core_attention is SdpaCoreAttention
    assert unfused.submodules.self_attention.submodules.core_attention is DotProductAttention
    assert sdpa.submodules.self_attention.submodules.linear_qkv is unfused.submodules.self_attention.submodules.linear_qkv
    with pytest.raises(ValueError, match="choose one of sdpa, unfused"):
        local_layer_spec(True, "flash")


@pytest.mark.megatron
@pytest.mark.usefixtures("cpu_megatron")
@pytest.mark.parametrize("name", FAMILIES)
def test_gptmodel_with_sdpa_spec_matches_hf_logits(name: str) -> None:
    import torch.nn.functional as F
    from megatron.core.models.gpt import GPTModel

    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.convert import WeightLayout
    from relax.backends.megatron.model import BuiltModel, local_layer_spec
    from relax.models import build_model
    from tests.megatron_helpers import load_hf_state

    hf = build_model(name, seed=7).eval()
    spec = McoreModelSpec.from_hf(hf.config)
    config = TransformerConfig(**spec.transformer_config_kwargs(), activation_func=F.silu,
                               use_cpu_initialization=True, perform_initialization=False)
    gpt = GPTModel(config, local_layer_spec(spec.qk_layernorm, "sdpa"), **spec.gpt_model_kwargs()).eval()
    assert all(isinstance(layer.self_attention.core_attention, SdpaCoreAttention) for layer in gpt.decoder.layers)
    load_hf_state(BuiltModel(gpt, gpt, config, WeightLayout.from_spec(spec), spec.vocab_size), hf.state_dict())
    ids = torch.randint(0, spec.vocab_size, (2, 13), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = hf(input_ids=ids).logits
        out = gpt(input_ids=ids, position_ids=torch.arange(13).expand(2, -1), attention_mask=None)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-5)
