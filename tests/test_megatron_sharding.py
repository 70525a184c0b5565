"""Sharding math of the Megatron backend on CPU (no megatron-core): HF -> TP/PP/EP shards -> HF is the identity.

For Qwen2 / Qwen3 / Llama and Qwen3-MoE / Mixtral configs and every (TP, PP, EP) in {1, 2, 4} that
divides the model (expert TP 1 and = TP), every rank reads its slices of the HF tensors
(`read_shard`, the sliced reads the trainer does), which must equal the split of the full
megatron tensor (`shard`), and gathering all ranks' pieces back (`unshard` + `separate`) must give
every HF tensor bitwise. Vocabularies are odd, so vocab padding is exercised.
"""

from __future__ import annotations

import itertools

import pytest
import torch
import transformers as tf
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.megatron.config import McoreModelSpec
from relax.backends.megatron.convert import hf_to_mcore, mcore_to_hf
from relax.backends.megatron.hf_source import SafetensorsReader, StateDictReader, checkpoint_state
from relax.backends.megatron.layout import Param, Split, WeightLayout, catalogue, combine, separate
from relax.backends.megatron.sharding import (
    ParallelLayout,
    RankPos,
    global_name,
    holds,
    local_name,
    read_shard,
    shard,
    stage_layers,
    unshard,
)

COMMON = dict(vocab_size=37, hidden_size=32, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
              max_position_embeddings=64)


def _configs() -> dict[str, object]:
    return {
        "qwen3": tf.Qwen3Config(**COMMON, intermediate_size=48, head_dim=8, tie_word_embeddings=False),
        "qwen2": tf.Qwen2Config(**COMMON, intermediate_size=48, tie_word_embeddings=True),
        "llama": tf.LlamaConfig(**COMMON, intermediate_size=48, head_dim=8, tie_word_embeddings=True),
        "qwen3_moe": tf.Qwen3MoeConfig(**COMMON, moe_intermediate_size=16, head_dim=8, num_experts=4,
                                       num_experts_per_tok=2, tie_word_embeddings=False),
        "mixtral": tf.MixtralConfig(**COMMON, intermediate_size=16, num_local_experts=4, num_experts_per_tok=2,
                                    tie_word_embeddings=False),
    }


CLASSES = {"qwen3": tf.Qwen3ForCausalLM, "qwen2": tf.Qwen2ForCausalLM, "llama": tf.LlamaForCausalLM,
           "qwen3_moe": tf.Qwen3MoeForCausalLM, "mixtral": tf.MixtralForCausalLM}


@pytest.fixture(scope="module")
def models() -> dict[str, tuple[WeightLayout, dict[str, torch.Tensor], McoreModelSpec]]:
    out = {}
    for name, cfg in _configs().items():
        torch.manual_seed(len(name))
        model = CLASSES[name](cfg)
        spec = McoreModelSpec.from_hf(cfg)
        wl = WeightLayout.from_spec(spec)
        out[name] = (wl, checkpoint_state(model.state_dict(), wl), spec)
    return out


def _layouts(spec: McoreModelSpec) -> list[ParallelLayout]:
    sizes = (1, 2, 4)
    out = []
    for tp, pp, ep in itertools.product(sizes, sizes, sizes):
        if spec.num_query_groups % tp or spec.num_layers % pp or (ep > 1 and not spec.num_experts):
            continue
        if spec.num_experts and spec.num_experts % ep:
            continue
        for etp in sorted({1, tp}) if spec.num_experts else (1,):
            out.append(ParallelLayout(tp=tp, pp=pp, ep=ep, etp=etp))
    return out


def _positions(par: ParallelLayout) -> list[RankPos]:
    return [RankPos(tp, pp, ep, etp) for tp, pp, ep, etp in
            itertools.product(range(par.tp), range(par.pp), range(par.ep), range(par.etp))]


def _split_and_gather(wl: WeightLayout, hf: dict[str, torch.Tensor], par: ParallelLayout, vocab: int):
    reader = StateDictReader(hf)
    params = catalogue(wl, pipeline_parallel=par.pp)
    local_names: dict[tuple[int, int, int, int], list[str]] = {}
    back: dict[str, torch.Tensor] = {}
    for param in params:
        full = combine(param, [hf[h] for h in param.hf], wl)
        size = par.split_size(param)
        pieces: dict[int, torch.Tensor] = {}
        for pos in _positions(par):
            if not holds(param, wl, par, pos):
                continue
            rank = pos.split_rank(param)
            piece = read_shard(param, reader, rank, size, wl, vocab)
            assert torch.equal(piece, shard(param, full, rank, size, vocab)), (param.name, pos)
            if rank in pieces:  # replicas (other TP ranks for experts, other EP ranks for dense) hold the same piece
                assert torch.equal(pieces[rank], piece), (param.name, pos)
            pieces[rank] = piece
            local_names.setdefault((pos.tp, pos.pp, pos.ep, pos.etp), []).append(local_name(param, wl, par))
        assert sorted(pieces) == list(range(size)), (param.name, sorted(pieces))
        if not param.load_only:
            for name, tensor in separate(param, unshard(param, [pieces[r] for r in range(size)], vocab), wl):
                assert name not in back, name
                back[name] = tensor
    for names in local_names.values():
        assert len(names) == len(set(names))
    return back, local_names


@pytest.mark.parametrize("family", list(CLASSES))
def test_split_then_gather_is_bitwise_identity_for_every_layout(models, family: str) -> None:
    wl, hf, spec = models[family]
    layouts = _layouts(spec)
    assert len(layouts) == (45 if spec.num_experts else 9)  # MoE: 9 (TP, PP) x 3 EP, expert TP 1 or TP
    for par in layouts:
        back, local_names = _split_and_gather(wl, hf, par, spec.vocab_size)
        assert set(back) == set(hf), (par, set(back) ^ set(hf))
        for name, tensor in hf.items():
            assert back[name].dtype == tensor.dtype and torch.equal(back[name], tensor), (par, name)
        stage0 = local_names[(0, 0, 0, 0)]
        assert "embedding.word_embeddings.weight" in stage0
        assert ("output_layer.weight" in stage0) == (par.pp == 1 and not wl.tie_word_embeddings)
        per_stage = wl.num_layers // par.pp
        layers = {int(n.split(".")[2]) for n in stage0 if n.startswith("decoder.layers.")}
        assert layers == set(range(per_stage)), (par, layers)


def test_pipeline_stages_and_expert_ranks_partition_the_model(models) -> None:
    wl, _, _ = models["qwen3_moe"]
    par = ParallelLayout(tp=1, pp=2, ep=2)
    assert [list(stage_layers(4, 2, s)) for s in range(2)] == [[0, 1], [2, 3]]
    params = catalogue(wl, pipeline_parallel=2)
    expert = next(p for p in params if p.expert == 3 and p.layer == 2)
    assert holds(expert, wl, par, RankPos(pp=1, ep=1)) and not holds(expert, wl, par, RankPos(pp=1, ep=0))
    assert local_name(expert, wl, par) == "decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"
    for param in params:  # global_name inverts local_name on the rank that holds the parameter
        for pos in _positions(par):
            if holds(param, wl, par, pos):
                assert global_name(local_name(param, wl, par), wl, par, pos) == param.name
    with pytest.raises(ValueError, match="does not split evenly"):
        local_name(expert, wl, ParallelLayout(pp=3))


def test_tied_embeddings_with_pipeline_stages_load_the_last_stage_output_layer(models) -> None:
    wl, hf, spec = models["llama"]
    par = ParallelLayout(tp=2, pp=2)
    output = [p for p in catalogue(wl, pipeline_parallel=2) if p.name == "output_layer.weight"]
    assert len(output) == 1 and output[0].load_only and output[0].hf == ("model.embed_tokens.weight",)
    assert holds(output[0], wl, par, RankPos(pp=1)) and not holds(output[0], wl, par, RankPos(pp=0))
    piece = read_shard(output[0], StateDictReader(hf), 1, 2, wl, spec.vocab_size)
    assert piece.shape[0] == 19  # 37 rows padded to 38, split in two
    assert torch.equal(piece[:18], hf["model.embed_tokens.weight"][19:]) and not piece[18].any()


def test_one_rank_layout_equals_the_raw_converter(models) -> None:
    for wl, hf, spec in models.values():
        raw = hf_to_mcore(hf, wl)
        par = ParallelLayout()
        reader = StateDictReader(hf)
        sharded = {local_name(p, wl, par): read_shard(p, reader, 0, 1, wl, spec.vocab_size) for p in catalogue(wl)}
        assert set(sharded) == set(raw)
        assert all(torch.equal(sharded[k], raw[k]) for k in raw)
        back = mcore_to_hf(raw, wl)
        assert all(torch.equal(back[k], v) for k, v in hf.items())


def test_safetensors_reads_only_slices_and_match_memory(models, tmp_path) -> None:
    from safetensors.torch import save_file

    wl, hf, spec = models["qwen3_moe"]
    save_file({k: v.contiguous() for k, v in hf.items()}, str(tmp_path / "model.safetensors"))
    disk, memory = SafetensorsReader(tmp_path), StateDictReader(hf)
    assert disk.names() == memory.names()
    par = ParallelLayout(tp=2, pp=2, ep=2, etp=2)
    for param in catalogue(wl, pipeline_parallel=2):
        size = par.split_size(param)
        for rank in range(size):
            a = read_shard(param, disk, rank, size, wl, spec.vocab_size)
            assert torch.equal(a, read_shard(param, memory, rank, size, wl, spec.vocab_size)), param.name


def test_in_memory_experts_map_to_checkpoint_names(tmp_path) -> None:
    """transformers writes fused in-memory experts per expert; `checkpoint_state` must name and slice them the same."""
    from safetensors import safe_open

    for family in ("qwen3_moe", "mixtral"):
        cfg = _configs()[family]
        torch.manual_seed(0)
        model = CLASSES[family](cfg)
        model.save_pretrained(tmp_path / family)
        wl = WeightLayout.from_spec(McoreModelSpec.from_hf(cfg))
        ours = checkpoint_state(model.state_dict(), wl)
        with safe_open(str(tmp_path / family / "model.safetensors"), framework="pt") as f:
            assert set(f.keys()) == set(ours), set(f.keys()) ^ set(ours)
            for name in f.keys():
                assert torch.equal(f.get_tensor(name), ours[name]), name


# ---------------------------------------------------------------------- properties of one split
_SPLITS = [Split.ROW, Split.QKV, Split.GLU, Split.VOCAB, Split.REPLICATED]


@settings(max_examples=60, deadline=None)
@given(split=st.sampled_from(_SPLITS), size=st.sampled_from([1, 2, 3, 4]), per=st.integers(1, 3),
       other=st.integers(1, 5), vocab_cut=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_shard_unshard_round_trip(split: Split, size: int, per: int, other: int, vocab_cut: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    groups, hpg, d = size * per, 2, 2
    wl = WeightLayout(1, groups * hpg, groups, d, False, False, False)
    if split is Split.QKV:
        hf = {"q": torch.randn(groups * hpg * d, other, generator=g), "k": torch.randn(groups * d, other, generator=g),
              "v": torch.randn(groups * d, other, generator=g)}
    elif split is Split.GLU:
        hf = {"g": torch.randn(size * per, other, generator=g), "u": torch.randn(size * per, other, generator=g)}
    elif split is Split.ROW:
        hf = {"w": torch.randn(other, size * per, generator=g)}
    else:
        hf = {"w": torch.randn(max(1, size * per - vocab_cut), other, generator=g)}
    param = Param("p", tuple(hf), split)
    vocab = hf["w"].shape[0] if split is Split.VOCAB else 0
    full = combine(param, list(hf.values()), wl)
    pieces = [shard(param, full, r, size, vocab) for r in range(size)]
    reader = StateDictReader(hf)
    for r in range(size):
        assert torch.equal(pieces[r], read_shard(param, reader, r, size, wl, vocab))
    if split is Split.VOCAB:
        assert len({p.shape[0] for p in pieces}) == 1
    assert torch.equal(unshard(param, pieces, vocab), full)
    back = dict(separate(param, full, wl))
    assert all(torch.equal(back[k], v) for k, v in hf.items())
