"""One-rank helpers for tests of megatron-core models: a whole in-memory HF state dict in, HF tensors out."""

from __future__ import annotations

import torch


def load_hf_state(built, hf_state: dict[str, torch.Tensor]) -> None:
    """Load a whole HF state dict (transformers' in-memory names) into a one-rank ``BuiltModel``."""
    from relax.backends.megatron.hf_source import StateDictReader, checkpoint_state
    from relax.backends.megatron.sharding import ParallelLayout, RankPos
    from relax.backends.megatron.weights import ShardPlan, load_hf_weights

    reader = StateDictReader(checkpoint_state(hf_state, built.layout))
    load_hf_weights(built, ShardPlan.of(built, ParallelLayout(), RankPos()), reader)


def export_hf_state(built) -> dict[str, torch.Tensor]:
    """A one-rank ``BuiltModel``'s weights under HF names (the raw converter)."""
    from relax.backends.megatron.convert import EXTRA_STATE_SUFFIX, mcore_to_hf

    state = {k: v.detach() for k, v in built.gpt.state_dict().items() if not k.endswith(EXTRA_STATE_SUFFIX)}
    return mcore_to_hf(state, built.layout)


def init_one_rank(seed: int = 1234) -> None:
    """megatron-core's parallel state as a world of one (the one-GPU backend's)."""
    from relax.backends.megatron.parallel import ParallelSizes, init_parallel_state

    init_parallel_state(ParallelSizes(), seed)


def write_tiny_moe(path) -> str:
    """A tiny Qwen3-MoE HF directory (2 layers, 4 experts, top-2, seed 0) with the tiny-qwen3 tokenizer: the MoE of
    the gloo CPU tests of the Megatron backend."""
    import transformers as tf

    from relax.models import load_tokenizer

    cfg = tf.Qwen3MoeConfig(vocab_size=100, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2,
                            num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts=4,
                            num_experts_per_tok=2, norm_topk_prob=True, max_position_embeddings=256, pad_token_id=0)
    torch.manual_seed(0)
    tf.Qwen3MoeForCausalLM(cfg).save_pretrained(path)
    load_tokenizer("tiny-qwen3").save_pretrained(path)
    return str(path)
