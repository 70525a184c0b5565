"""Value loss, critic learning-rate warmup and the actor/critic schedule against plain references."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.algorithms import AlgorithmConfig, critic_lr_at, merge_metrics, should_update_actor, value_loss
from tests.algo_refs import make_args, near, random_mask, random_matrix, reduce_ref, t


def _cfg(**kw) -> AlgorithmConfig:
    return AlgorithmConfig.from_args(make_args(**kw))


def _ref(values, old, returns, mask, clip, per_token, n, n_tokens):
    losses, flags = [], []
    for vr, orow, rr in zip(values, old, returns, strict=True):
        lrow, frow = [], []
        for v, o, r in zip(vr, orow, rr, strict=True):
            vc = o + min(max(v - o, -clip), clip)
            lrow.append(0.5 * max((v - r) ** 2, (vc - r) ** 2))
            frow.append(float((vc - r) ** 2 > (v - r) ** 2))
        losses.append(lrow), flags.append(frow)
    return reduce_ref(losses, mask, per_token, n, n_tokens), reduce_ref(flags, mask, per_token, n, n_tokens)


def _data(seed: int, b: int = 6, t_len: int = 5):
    rng = random.Random(seed)
    old = random_matrix(rng, b, t_len, -1, 1)
    return (
        near(rng, old, 0.5),
        old,
        random_matrix(rng, b, t_len, -2, 2),
        random_mask(rng, b, t_len, empty_rows=2),
    )


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("clip", [0.05, 0.2, 10.0])
@pytest.mark.parametrize("seed", range(3))
def test_value_loss_matches_reference(seed: int, clip: float, per_token: bool) -> None:
    values, old, returns, mask = _data(seed)
    n_tokens = int(sum(map(sum, mask)))
    loss, m = value_loss(
        _cfg(value_clip=clip, calculate_per_token_loss=per_token),
        values=t(values),
        old_values=t(old),
        returns=t(returns),
        loss_mask=t(mask),
        num_global_samples=6,
        num_global_tokens=n_tokens,
    )
    ref_loss, ref_clip = _ref(values, old, returns, mask, clip, per_token, 6, n_tokens)
    assert abs(float(loss) - ref_loss) < 1e-12 and abs(float(m["value_clipfrac"]) - ref_clip) < 1e-12


@settings(deadline=None, max_examples=40)
@given(st.integers(0, 10_000), st.sampled_from([1, 2, 3, 6]), st.booleans())
def test_value_loss_micro_batches_sum_to_full_batch(seed: int, splits: int, per_token: bool) -> None:
    values, old, returns, mask = _data(seed)
    cfg, n_tokens = _cfg(calculate_per_token_loss=per_token), int(sum(map(sum, mask)))

    def run(rows):
        v = t(values[rows]).requires_grad_(True)
        loss, m = value_loss(
            cfg,
            values=v,
            old_values=t(old[rows]),
            returns=t(returns[rows]),
            loss_mask=t(mask[rows]),
            num_global_samples=6,
            num_global_tokens=n_tokens,
        )
        loss.backward()
        return m, v.grad

    full, full_grad = run(slice(None))
    merged, grads = {}, []
    for s in range(0, 6, 6 // splits):
        m, g = run(slice(s, s + 6 // splits))
        merged = merge_metrics(merged, m)
        grads.append(g)
    assert all(abs(float(merged[k]) - float(full[k])) < 1e-6 for k in full)
    assert torch.allclose(torch.cat(grads), full_grad, atol=1e-6, rtol=0)


@pytest.mark.parametrize(("warmup", "expected"), [(0, [1e-3] * 4), (4, [2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])])
def test_critic_lr_warmup_is_linear(warmup: int, expected: list[float]) -> None:
    cfg = _cfg(critic_lr=1e-3, critic_lr_warmup_iters=warmup)
    assert [critic_lr_at(step, cfg) for step in range(len(expected))] == pytest.approx(expected, abs=1e-15)


def test_critic_lr_defaults_to_lr() -> None:
    assert critic_lr_at(0, _cfg(lr=3e-5)) == 3e-5


def test_should_update_actor_schedule() -> None:
    cfg = _cfg(num_critic_only_steps=2)
    assert [should_update_actor(cfg, s) for s in range(4)] == [False, False, True, True]
    assert not any(should_update_actor(_cfg(critic_train_only=True), s) for s in range(4))
    assert should_update_actor(_cfg(), 0)
