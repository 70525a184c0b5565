"""`build_rollout_tensors` / `build_model_inputs` (whole-batch ops) against the per-row loops they replaced: equal
tensors, the Python doubles rounded to float32 the same way."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.torch.batch import TrainSample, build_model_inputs, build_rollout_tensors


def _reference_rows(rows, width):
    out = torch.zeros(len(rows), width, dtype=torch.float32)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=torch.float32)
    return out


def _reference_inputs(samples, width, pad_id):
    seq_len = max(len(s.tokens) for s in samples)
    b = len(samples)
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, seq_len), dtype=torch.long)
    positions = torch.zeros((b, width), dtype=torch.long)
    targets = torch.full((b, width), pad_id, dtype=torch.long)
    valid = torch.zeros((b, width), dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s.tokens)
        input_ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        attention_mask[i, :n] = 1
        r = s.response_length
        if r:
            positions[i, :r] = torch.arange(s.prompt_length - 1, n - 1)
            targets[i, :r] = input_ids[i, s.prompt_length : n]
            valid[i, :r] = True
    return input_ids, attention_mask, positions, targets, valid


@st.composite
def batches(draw):
    n = draw(st.integers(1, 6))
    out = []
    for _ in range(n):
        prompt = draw(st.integers(0, 7))
        response = draw(st.integers(0, 9))
        tokens = draw(st.lists(st.integers(0, 999), min_size=prompt + response, max_size=prompt + response))
        if not tokens:
            tokens, prompt = [5], 1
        mask = draw(st.lists(st.integers(0, 1), min_size=response, max_size=response))
        lps = draw(st.lists(st.floats(-20, 0), min_size=response, max_size=response))  # doubles, as the engine sends
        out.append(TrainSample(tokens=tokens, response_length=response, loss_mask=mask, reward=draw(st.floats(-1, 1)),
                               rollout_log_probs=lps))
    return out


@settings(max_examples=150, deadline=None)
@given(batches(), st.integers(0, 3))
def test_batch_tensors_match_the_row_loop(samples, extra_width):
    batch = build_rollout_tensors(samples)
    width = max(s.response_length for s in samples)
    assert torch.equal(batch.loss_mask, _reference_rows([[float(m) for m in s.loss_mask] for s in samples], width))
    assert torch.equal(batch.rollout_log_probs, _reference_rows([s.rollout_log_probs for s in samples], width))
    got = build_model_inputs(samples, width + extra_width, pad_id=7, device="cpu")
    want = _reference_inputs(samples, width + extra_width, 7)
    for name, g, w in zip(("input_ids", "attention_mask", "logit_positions", "target_ids", "valid"),
                          (got.input_ids, got.attention_mask, got.logit_positions, got.target_ids, got.valid), want,
                          strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w), name


def test_rows_longer_than_the_batch_name_the_sample():
    ok = TrainSample(tokens=[1, 2, 3], response_length=2, loss_mask=[1, 1], reward=0.0, rollout_log_probs=[-1.0, -2.0])
    bad = TrainSample(tokens=[1, 2, 3], response_length=1, loss_mask=[1], reward=0.0, rollout_log_probs=[-1.0, -2.0, -3.0])
    with pytest.raises(ValueError, match="sample 1: rollout_log_probs has 3 entries"):
        build_rollout_tensors([ok, bad])
    with pytest.raises(ValueError, match="sample 0: 2 response tokens, the batch is 1 wide"):
        build_model_inputs([ok], 1, pad_id=0, device="cpu")
