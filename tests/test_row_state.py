"""RowState's decode bookkeeping (relax/backends/embedded/rows.py): a decode step over a graph bucket wider than the
running rows moves only the active rows' counters and positions, and stages exactly the sampled tokens/log-probs
that the host fetches."""

from __future__ import annotations

import torch

from relax.backends.embedded.rows import RowState
from relax.backends.embedded.sampling import SamplingParams


def _state() -> RowState:
    state = RowState(slots=6, device=torch.device("cpu"))
    state.append([SamplingParams(temperature=0.0)] * 3, seeds=[1, 2, 3], counters=[4, 5, 6], lengths=[7, 8, 9])
    return state


def test_a_decode_step_over_a_wider_bucket_moves_only_the_running_rows() -> None:
    state = _state()
    logits = torch.zeros(5, 11)
    logits[torch.arange(5), torch.tensor([3, 1, 4, 1, 5])] = 1.0  # greedy picks these
    state.sample(logits, slice(0, 5), decoded=True)  # a graph bucket of 5 over 3 running rows
    assert state.tokens[:5].tolist() == [3, 1, 4, 1, 5]  # padded rows sample too (harmless, never fetched)
    assert state.counter.tolist() == [5, 6, 7, 0, 0, 0]
    assert state.positions.tolist() == [8, 9, 10, 0, 0, 0]
    state.fed(slice(0, 3))
    assert state.lengths == [8, 9, 10]
    tokens, logprobs = state.fetch(slice(0, 3)).result()
    expected = torch.log_softmax(logits[:3], -1)[torch.arange(3), torch.tensor([3, 1, 4])]
    assert tokens == [3, 1, 4]
    assert torch.allclose(torch.tensor(logprobs, dtype=torch.float32), expected)


def test_a_prefill_sample_moves_counters_only_and_keep_carries_the_activity() -> None:
    state = _state()
    state.sample(torch.randn(3, 11), slice(0, 3))
    state.advance(slice(0, 3))
    assert state.counter.tolist() == [5, 6, 7, 0, 0, 0] and state.positions.tolist() == [7, 8, 9, 0, 0, 0]
    state.keep([2, 0])
    assert state.active.tolist() == [1, 1, 0, 0, 0, 0]
    assert state.positions.tolist() == [9, 7, 0, 0, 0, 0]
    state.sample(torch.randn(4, 11), slice(0, 4), decoded=True)
    assert state.positions.tolist() == [10, 8, 0, 0, 0, 0]  # the two spare rows of the bucket stay at 0
