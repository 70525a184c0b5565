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
