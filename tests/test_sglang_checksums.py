"""relax/weights/sglang_checksums.py: SGLang 0.5.14's own tensor hash and parameter layout, on the trainer's side.

The hashes are checked against SGLang's answers for fixed tensors (tests/data/sglang_tensor_hash.json, written
by SGLang's Triton kernels: ci/wheelhouse/sglang_hash_golden.py); tests/gpu/test_sglang_checksums_gpu.py
compares with the installed SGLang on a GPU.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.weights import sglang_checksums as sc

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = json.loads((ROOT / "tests/data/sglang_tensor_hash.json").read_text())


def _golden_module():
    spec = importlib.util.spec_from_file_location("sglang_hash_golden", ROOT / "ci/wheelhouse/sglang_hash_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{c['dtype']}x{c['numel']}")
def test_the_hash_is_sglangs_for_fixed_tensors(case, monkeypatch) -> None:
    t = _golden_module().case_tensor(case["dtype"], case["numel"], case["seed"])
    assert sc.hex_hash(t) == case["hash"]
    monkeypatch.setattr(sc, "_CHUNK_TILES", 1)  # every tile in a pass of its own: the same sum
    assert sc.hex_hash(t) == case["hash"]


def test_the_golden_cases_cover_padding_tile_edges_and_several_tiles() -> None:
    words = [-(-c["numel"] * torch.empty(0, dtype=getattr(torch, c["dtype"])).element_size() // 4)
             for c in GOLDEN["cases"]]
    assert min(words) == 1 and sc.TILE_WORDS in words and max(words) > 4 * sc.TILE_WORDS
    assert any(w % sc.TILE_WORDS == 1 for w in words)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 3 * 8192 + 7), st.integers(0, 10_000), st.data())
def test_any_single_word_change_changes_the_hash(numel, seed, data) -> None:
    t = torch.randint(0, 2**31 - 1, (numel,), generator=torch.Generator().manual_seed(seed), dtype=torch.int32)
    i = data.draw(st.integers(0, numel - 1))
    changed = t.clone()
    changed[i] ^= 1 << data.draw(st.integers(0, 30))
    assert sc.tensor_hash(changed) != sc.tensor_hash(t)


def test_an_empty_tensor_hashes_to_zero_as_in_sglang() -> None:
    assert sc.tensor_hash(torch.empty(0)) == 0


def _layer(prefix: str = "model.layers.0.") -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    shapes = {"self_attn.q_proj.weight": (8, 4), "self_attn.k_proj.weight": (4, 4), "self_attn.v_proj.weight": (4, 4),
              "self_attn.o_proj.weight": (4, 8), "mlp.gate_proj.weight": (6, 4), "mlp.up_proj.weight": (6, 4),
              "mlp.down_proj.weight": (4, 6), "input_layernorm.weight": (4,)}
    return {prefix + k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}


def test_stacked_parameters_are_hashed_as_sglang_holds_them_whatever_the_bucket_order() -> None:
    layer = _layer()
    p = "model.layers.0."
    qkv = torch.cat([layer[p + "self_attn.q_proj.weight"], layer[p + "self_attn.k_proj.weight"],
                     layer[p + "self_attn.v_proj.weight"]])
    gate_up = torch.cat([layer[p + "mlp.gate_proj.weight"], layer[p + "mlp.up_proj.weight"]])
    expected = {p + "self_attn.qkv_proj.weight": sc.hex_hash(qkv), p + "mlp.gate_up_proj.weight": sc.hex_hash(gate_up),
                **{k: sc.hex_hash(v) for k, v in layer.items()
                   if not any(part in k for part in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"))}}
    items = list(layer.items())
    for buckets in ([items], [items[::-1]], [[x] for x in items[3:]] + [items[:3]]):
        acc = sc.SGLangLayoutChecksums()
        for bucket in buckets:
            acc.add(bucket)
        assert acc.result() == expected


def test_a_tied_lm_head_is_the_embedding_and_an_untied_one_is_kept() -> None:
    emb = torch.randn(10, 4).to(torch.bfloat16)
    acc = sc.SGLangLayoutChecksums()
    acc.add([(sc.EMBEDDING, emb), (sc.LM_HEAD, emb.clone())])
    assert list(acc.result()) == [sc.EMBEDDING]
    acc = sc.SGLangLayoutChecksums()
    acc.add([(sc.EMBEDDING, emb), (sc.LM_HEAD, emb + 1)])
    assert set(acc.result()) == {sc.EMBEDDING, sc.LM_HEAD}


def test_embedding_and_lm_head_rows_are_zero_padded_to_64_as_sglang_holds_them() -> None:
    emb, head = torch.randn(70, 4).to(torch.bfloat16), torch.randn(64, 4).to(torch.bfloat16)
    acc = sc.SGLangLayoutChecksums()
    acc.add([(sc.EMBEDDING, emb), (sc.LM_HEAD, head)])
    padded = torch.cat([emb, torch.zeros(58, 4, dtype=torch.bfloat16)])
    assert acc.result() == {sc.EMBEDDING: sc.hex_hash(padded), sc.LM_HEAD: sc.hex_hash(head)}  # 64 rows: as is


def test_a_stacked_parameter_missing_a_part_is_an_error_naming_it() -> None:
    acc = sc.SGLangLayoutChecksums()
    acc.add([(k, v) for k, v in _layer().items() if "k_proj" not in k])
    with pytest.raises(ValueError, match=r"model\.layers\.0\.self_attn\.qkv_proj\.weight.: \[1\]"):
        acc.result()


def test_what_cannot_be_matched_says_why() -> None:
    assert sc.unverifiable(["model.layers.0.mlp.down_proj.weight"], 1) is None
    assert "2 tensor-parallel ranks whose model's key/value head count is not known" in sc.unverifiable([], 2)
    assert "MoE" in sc.unverifiable(["model.layers.0.mlp.experts.0.up_proj.weight"], 1)
    assert "MoE" in sc.unverifiable(["model.layers.0.mlp.experts.0.up_proj.weight"], 2, kv_heads=2)
    assert sc.unverifiable(list(_layer()) + [sc.EMBEDDING, "model.norm.weight"], 2, kv_heads=2) is None
    vision = "visual.blocks.0.attn.qkv.weight"
    assert f"how it shards {vision} is not known" in sc.unverifiable([vision], 2, kv_heads=2)


def _reference_rank(layer: dict[str, torch.Tensor], rank: int, tp: int, heads: int, kv_heads: int) -> dict:
    """What SGLang's loaders leave on tensor-parallel rank ``rank`` of ``tp``, written head by head (an independent
    restatement of QKVParallelLinear / MergedColumnParallelLinear / RowParallelLinear / VocabParallelEmbedding)."""
    p = "model.layers.0."
    q, k, v = (layer[p + f"self_attn.{n}_proj.weight"] for n in "qkv")
    head_dim = q.shape[0] // heads
    q_heads = q.view(heads, head_dim, -1)[rank * heads // tp:(rank + 1) * heads // tp]
    if tp <= kv_heads:
        kv = slice(rank * kv_heads // tp, (rank + 1) * kv_heads // tp)
    else:  # fewer heads than ranks: rank r holds head r * heads / ranks, replicated on its neighbours
        kv = slice(rank * kv_heads // tp, rank * kv_heads // tp + 1)
    qkv = torch.cat([q_heads.reshape(-1, q.shape[1]), k.view(kv_heads, head_dim, -1)[kv].reshape(-1, k.shape[1]),
                     v.view(kv_heads, head_dim, -1)[kv].reshape(-1, v.shape[1])])
    gate_up = torch.cat([layer[p + "mlp.gate_proj.weight"].chunk(tp)[rank], layer[p + "mlp.up_proj.weight"].chunk(tp)[rank]])
    out = {p + "self_attn.qkv_proj.weight": qkv, p + "mlp.gate_up_proj.weight": gate_up,
           p + "self_attn.o_proj.weight": layer[p + "self_attn.o_proj.weight"].chunk(tp, dim=1)[rank].contiguous(),
           p + "mlp.down_proj.weight": layer[p + "mlp.down_proj.weight"].chunk(tp, dim=1)[rank].contiguous(),
           p + "input_layernorm.weight": layer[p + "input_layernorm.weight"]}
    emb = layer[sc.EMBEDDING]
    padded = torch.zeros(-(-emb.shape[0] // 64) * 64, emb.shape[1], dtype=emb.dtype)
    padded[:emb.shape[0]] = emb
    out[sc.EMBEDDING] = padded.chunk(tp)[rank]
    return {f"tp{rank}/{name}": sc.hex_hash(t) for name, t in out.items()}


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_tensor_parallel_engines_get_each_ranks_shards_hashed_as_sglang_holds_them(kv_heads: int) -> None:
    """Engines of 2 and 4 ranks (with 4 query heads, 2 or 4 key/value heads: replicated and split), a tied
    lm_head (dropped on every rank) and a 70-row vocabulary (padded to 128, then split): every rank's hash of
    every parameter equals the head-by-head reference, whatever the bucket order."""
    g = torch.Generator().manual_seed(1)
    heads, head_dim, hidden = 4, 2, 8
    shapes = {"self_attn.q_proj.weight": (heads * head_dim, hidden),
              "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
              "self_attn.v_proj.weight": (kv_heads * head_dim, hidden), "self_attn.o_proj.weight": (hidden, heads * head_dim),
              "mlp.gate_proj.weight": (12, hidden), "mlp.up_proj.weight": (12, hidden), "mlp.down_proj.weight": (hidden, 12),
              "input_layernorm.weight": (hidden,)}
    layer = {"model.layers.0." + k: torch.randn(s, generator=g).to(torch.bfloat16) for k, s in shapes.items()}
    layer[sc.EMBEDDING] = torch.randn(70, hidden, generator=g).to(torch.bfloat16)
    items = [*layer.items(), (sc.LM_HEAD, layer[sc.EMBEDDING].clone())]
    for order in (items, items[::-1]):
        acc = sc.SGLangLayoutChecksums((1, 2, 4), kv_heads=kv_heads)
        for item in order:
            acc.add([item])
        for tp in (2, 4):
            expected = {}
            for rank in range(tp):
                expected.update(_reference_rank(layer, rank, tp, heads, kv_heads))
            assert acc.result(tp) == expected
        assert sc.EMBEDDING in acc.result(1) and sc.LM_HEAD not in acc.result(1)
    assert sc.layout_name(1) == "sglang" and sc.layout_name(2) == "sglang-tp2"
    with pytest.raises(ValueError, match="key/value head count"):
        sc.SGLangLayoutChecksums((2,))


# SGLang 0.5.14's named_parameters() of Qwen2_5_VLForConditionalGeneration for a 2-layer text model and a 1-block
# vision tower (models/qwen2_5_vl.py: Qwen2Model as ``model``, Qwen2_5_VisionTransformer as ``visual``; its
# VisionAttention holds ``qkv_proj`` and ``proj``, Qwen2_5_VLMLP ``gate_up_proj`` and ``down_proj``, the merger
# ``ln_q`` and ``mlp.0`` / ``mlp.2``; a tied lm_head is ``model.embed_tokens`` itself): what /weights_checker hashes
# (its buffers are rotary caches it skips: inv_freq, cos_sin_cache).
_SGLANG_VL_LAYER = ["self_attn.qkv_proj.weight", "self_attn.qkv_proj.bias", "self_attn.o_proj.weight",
                    "mlp.gate_up_proj.weight", "mlp.down_proj.weight", "input_layernorm.weight",
                    "post_attention_layernorm.weight"]
_SGLANG_VL_BLOCK = ["norm1.weight", "norm2.weight", "attn.qkv_proj.weight", "attn.qkv_proj.bias", "attn.proj.weight",
                    "attn.proj.bias", "mlp.gate_up_proj.weight", "mlp.gate_up_proj.bias", "mlp.down_proj.weight",
                    "mlp.down_proj.bias"]
SGLANG_TINY_VL_NAMES = {
    "model.embed_tokens.weight", "model.norm.weight", "visual.patch_embed.proj.weight", "visual.merger.ln_q.weight",
    "visual.merger.mlp.0.weight", "visual.merger.mlp.0.bias", "visual.merger.mlp.2.weight", "visual.merger.mlp.2.bias",
    *(f"model.layers.{i}.{k}" for i in range(2) for k in _SGLANG_VL_LAYER),
    *(f"visual.blocks.0.{k}" for k in _SGLANG_VL_BLOCK)}


@pytest.mark.parametrize("preset", ["tiny-qwen2.5-vl", "tiny-qwen2.5-vl-p14"])
def test_a_vlm_sync_is_hashed_under_sglangs_parameter_names(preset: str) -> None:
    """The trainer's tensors of a VLM sync (checkpoint names: relax/models/checkpoint_names.py) come out under
    exactly SGLang's parameter names: the vision qkv kept fused as ``attn.qkv_proj``, its gate/up stacked with
    their biases, the tied lm_head left to the padded embedding."""
    from relax.models import build_model
    from relax.models.checkpoint_names import checkpoint_state, moe_style

    model = build_model(preset, dtype=torch.bfloat16, seed=1)
    named = list(checkpoint_state(model.state_dict(), moe_style(model.config)).items())
    acc = sc.SGLangLayoutChecksums()
    acc.add(named)
    sums = acc.result()
    assert set(sums) == SGLANG_TINY_VL_NAMES
    tensors = dict(named)
    qkv = "visual.blocks.0.attn.qkv"
    assert sums[qkv + "_proj.weight"] == sc.hex_hash(tensors[qkv + ".weight"])
    gate_up = torch.cat([tensors["visual.blocks.0.mlp.gate_proj.bias"], tensors["visual.blocks.0.mlp.up_proj.bias"]])
    assert sums["visual.blocks.0.mlp.gate_up_proj.bias"] == sc.hex_hash(gate_up)
    assert sums[sc.EMBEDDING] == sc.hex_hash(sc.pad_vocab(tensors[sc.EMBEDDING]))  # 104 rows held as 128


def test_the_key_value_head_count_comes_from_the_model_a_vlm_from_its_text_model() -> None:
    """What a tensor-parallel engine's target carries (the SGLang launcher's and an external server's): the model's
    key/value heads, a VLM's from its language model's config."""
    from relax.models.registry import build_config, key_value_heads

    assert key_value_heads("small-qwen3") == build_config("small-qwen3").num_key_value_heads == 2
    assert key_value_heads("bench-270m") == 8
    assert key_value_heads("tiny-qwen2.5-vl") == build_config("tiny-qwen2.5-vl").text_config.num_key_value_heads
