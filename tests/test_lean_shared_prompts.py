"""The lean runner's shared prompts (relax/backends/embedded/lean_runner.py): rows admitted together with the same
prompt prefill it once and read its K/V from the first row's slot. Every request must get what it gets alone
(same seeded tokens, log-probs to float rounding), however the rows that hold a prompt leave: first, in the
middle of a group, with holes filled by compaction, in overlap mode."""

from __future__ import annotations

import pytest
import torch

from tests.test_engine_core import make_engine, req, tiny_model

PROMPT_A = [5, 6, 7, 8, 9, 10, 11]
PROMPT_B = [40, 41, 42]


@pytest.fixture(scope="module")
def model():
    return tiny_model()


def _alone(model, requests: list[dict]) -> list[dict]:
    engine = make_engine(model, "lean")
    return [engine.generate([r])[0] for r in requests]


def _assert_same(together: list[dict], alone: list[dict]) -> None:
    for a, b in zip(together, alone, strict=True):
        assert a["output_ids"] == b["output_ids"]
        lp_a = [x[0] for x in a["meta_info"]["output_token_logprobs"]]
        lp_b = [x[0] for x in b["meta_info"]["output_token_logprobs"]]
        assert max(abs(x - y) for x, y in zip(lp_a, lp_b, strict=True)) < 1e-5


@pytest.mark.parametrize("mode", ["lean", "lean+overlap"])
def test_a_group_of_one_prompt_prefills_once_and_samples_what_each_request_samples_alone(model, mode) -> None:
    requests = [req(PROMPT_A, seed=i, max_new=12) for i in range(4)] + [req(PROMPT_B, seed=10 + i, max_new=9)
                                                                        for i in range(3)]
    engine = make_engine(model, mode)
    together = engine.generate(requests)
    assert engine.runner.shared_prompt_rows == 5  # 3 rows read A's K/V from its first row, 2 read B's
    assert len({tuple(r["output_ids"]) for r in together}) == len(requests)  # the seeds still differ
    _assert_same(together, _alone(model, requests))


@pytest.mark.parametrize("mode", ["lean", "lean+overlap"])
def test_the_row_holding_a_prompt_leaves_first_and_hands_it_over(model, mode) -> None:
    """Row 0 holds A and stops after 2 tokens; rows 1-3 read it and run on (one of them stops in between, B's
    rows leave at other times, so compaction moves rows whose prompt source moves too)."""
    requests = [req(PROMPT_A, seed=0, max_new=2), req(PROMPT_B, seed=1, max_new=4), req(PROMPT_A, seed=2, max_new=15),
                req(PROMPT_A, seed=3, max_new=6), req(PROMPT_B, seed=4, max_new=11), req(PROMPT_A, seed=5, max_new=13)]
    engine = make_engine(model, mode)
    together = engine.generate(requests)
    assert engine.runner.shared_prompt_rows == 4
    _assert_same(together, _alone(model, requests))


def test_hand_over_copies_the_prompt_and_repoints_the_readers(model) -> None:
    engine = make_engine(model, "lean")
    runner = engine.runner
    runner.prefill([PROMPT_A, PROMPT_B, PROMPT_A, PROMPT_A])
    assert runner._shared_from == [0, 1, 0, 0] and runner._shared_len == [0, 0, len(PROMPT_A), len(PROMPT_A)]
    k_before = [k[0, :, :len(PROMPT_A)].clone() for k in runner.k]
    order = runner.keep([1, 2, 3])  # row 0 (holds A) leaves: row 2 inherits A, row 3 reads it there
    assert order == [3, 1, 2]  # the last row fills the hole
    assert runner._shared_from == [2, 1, 2] and runner._shared_len == [len(PROMPT_A), 0, 0]
    assert all(torch.equal(k[2, :, :len(PROMPT_A)], kb) for k, kb in zip(runner.k, k_before, strict=True))
    assert runner._prefix_rows[:4].tolist() == [2, 1, 2, 3] and runner._prefix_lens[:4].tolist() == [7, 0, 0, 0]
    runner.keep([0, 2])  # the reader and the holder stay; row 1 leaves, the holder moves into its slot
    assert runner._shared_from == [1, 1] and runner._shared_len == [len(PROMPT_A), 0]
    runner.reset()
    assert runner._prefix_lens.sum() == 0 and not runner._sharing
