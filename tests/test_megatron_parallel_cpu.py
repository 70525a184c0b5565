"""The sharded layout against megatron-core itself: real GPTModels built with TP / PP / EP over gloo CPU workers.

Each worker builds its part of megatron-core's GPTModel (local spec, relax's norms and SDPA
attention) with the parallel sizes, loads its slices of an HF model through relax's sharding
(`load_hf_weights` checks every parameter name and shape against what megatron built), then:

- gathers the full HF tensors back onto rank 0 with the exporter (bitwise equal to what went in);
- runs a forward pass: the logits must match the HF model's (bf16 weights; the tolerance is the
  bf16 floor, the same HF model in bf16 vs fp32, a layout mistake is orders of magnitude larger).

Needs megatron-core (marker ``megatron``; CI without it skips). tests/megatron_workers.py explains the
CPU shims.
"""

from __future__ import annotations

import pytest
import torch
import transformers as tf

from relax.backends.megatron.checks import module_available

pytestmark = [pytest.mark.megatron,
              pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")]

COMMON = dict(vocab_size=37, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
              max_position_embeddings=64, rms_norm_eps=1e-6)
FAMILIES = {
    "qwen3": (tf.Qwen3ForCausalLM, lambda: tf.Qwen3Config(**COMMON, intermediate_size=96, head_dim=16,
                                                          tie_word_embeddings=False)),
    "llama": (tf.LlamaForCausalLM, lambda: tf.LlamaConfig(**COMMON, intermediate_size=96, head_dim=16,
                                                          tie_word_embeddings=True)),
    "qwen2": (tf.Qwen2ForCausalLM, lambda: tf.Qwen2Config(**COMMON, intermediate_size=96, tie_word_embeddings=True)),
    "qwen3_moe": (tf.Qwen3MoeForCausalLM, lambda: tf.Qwen3MoeConfig(
        **COMMON, moe_intermediate_size=32, head_dim=16, num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
        tie_word_embeddings=False)),
}


def _hf_model(family: str):
    cls, make = FAMILIES[family]
    torch.manual_seed(7)
    return cls(make()).eval()


def _ids() -> torch.Tensor:
    return torch.randint(1, 37, (2, 8), generator=torch.Generator().manual_seed(3))


def _worker(rank: int, family: str, sizes: tuple) -> dict:
    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.export import HFExporter
    from relax.backends.megatron.hf_source import StateDictReader, checkpoint_state
    from relax.backends.megatron.model import build_gpt_model
    from relax.backends.megatron.parallel import ParallelSizes, init_parallel_state, rank_pos
    from relax.backends.megatron.weights import ShardPlan, load_hf_weights

    sizes = ParallelSizes(*sizes)
    init_parallel_state(sizes, 1234, backend="gloo")
    hf_model = _hf_model(family)
    spec = McoreModelSpec.from_hf(hf_model.config)
    built = build_gpt_model(spec, sizes=sizes, device="cpu")
    plan = ShardPlan.of(built, sizes.layout, rank_pos())
    hf = checkpoint_state({k: v.to(torch.bfloat16) for k, v in hf_model.state_dict().items()}, plan.wl)
    load_hf_weights(built, plan, StateDictReader(hf))
    exported: dict[str, torch.Tensor] = {}
    counts = []
    for bucket in HFExporter(built, plan).buckets(bucket_bytes=8192):
        counts.append(len(bucket))
        exported.update(bucket)
    out = {"buckets": len(counts)}
    if rank == 0:
        out["unequal"] = sorted(k for k in hf if k not in exported or not torch.equal(exported[k], hf[k]))
        out["extra"] = sorted(set(exported) - set(hf))
    if sizes.pp == 1:
        ids = _ids()
        with torch.no_grad():
            logits = built.module.eval()(input_ids=ids, position_ids=torch.arange(8).expand(2, -1),
                                         attention_mask=None, fp32_output=False)
        out["logits"] = logits[..., : spec.vocab_size].float()
    return out


CASES = [
    ("qwen3", (2, 1, 1, 1, 1, False), 2),
    ("qwen3", (2, 1, 1, 1, 1, True), 2),  # sequence parallel
    ("llama", (1, 2, 1, 1, 1, False), 2),  # pipeline, tied embeddings
    ("qwen2", (2, 2, 1, 1, 1, False), 4),  # TP x PP, qkv bias
    ("qwen3_moe", (1, 1, 1, 2, 1, False), 2),  # expert parallel
    ("qwen3_moe", (2, 1, 1, 2, 1, True), 2),  # TP + EP (+ SP, megatron's rule)
]


@pytest.mark.parametrize("family, sizes, world", CASES, ids=[f"{f}-{'x'.join(map(str, s[:5]))}{'-sp' if s[5] else ''}"
                                                           for f, s, _ in CASES])
def test_megatron_builds_the_layout_relax_shards(family: str, sizes: tuple, world: int) -> None:
    from tests.megatron_workers import spawn

    result = spawn(_worker, world, family, sizes)
    assert result["unequal"] == [] and result["extra"] == [], result
    assert result["buckets"] > 1
    if "logits" in result:
        hf_model = _hf_model(family)
        with torch.no_grad():
            ref = hf_model(input_ids=_ids()).logits
            floor = (hf_model.to(torch.bfloat16)(input_ids=_ids()).logits.float() - ref).abs().max()
        diff = (result["logits"] - ref).abs().max()
        assert diff <= 3 * floor + 1e-3, (float(diff), float(floor))
