"""Advantage estimators against plain float64 references (tests/algo_refs.py), plus properties."""

from __future__ import annotations

import math
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.algorithms import AlgorithmConfig, compute_advantages
from relax.algorithms.advantages import ESTIMATORS
from tests.algo_refs import (
    group_norm_ref,
    make_args,
    masked_rows,
    near,
    random_mask,
    random_matrix,
    t,
    whiten_ref,
)

GROUP = 4


def _cfg(**kw) -> AlgorithmConfig:
    return AlgorithmConfig.from_args(make_args(**kw))


def _scatter(rows, mask):
    """Inverse of masked_rows: put each row's valid-token values back at the valid positions."""
    out = []
    for vals, mr in zip(rows, mask, strict=True):
        it = iter(vals)
        out.append([next(it) if k else 0.0 for k in mr])
    return out


def _ref(est: str, o: dict, rewards, mask, old, ref, values, teacher):
    """Reference advantages/returns for one estimator, written from docs/algorithms.md."""
    kl_coef = o.get("kl_coef", 0.0)
    kl_rows = [
        [kl_coef * (a - b) for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(old, ref, strict=True)
    ]
    kl_rows = masked_rows(kl_rows, mask)
    shaped = [r - sum(k) for r, k in zip(rewards, kl_rows, strict=True)]
    normalize = not (o.get("disable_rewards_normalization") or o.get("custom_reward_post_process_path"))
    returns = None
    if est in ("grpo", "gspo", "sapo", "cispo", "reinforce_plus_plus_baseline"):
        std = est != "reinforce_plus_plus_baseline" and not o.get("disable_grpo_std_normalization")
        scores = group_norm_ref(shaped, GROUP, std) if normalize else shaped
        adv = [[s * k for k in mr] for s, mr in zip(scores, mask, strict=True)]
        if est == "reinforce_plus_plus_baseline":
            adv = whiten_ref(adv, mask)
    elif est == "rloo":
        scores = []
        for g in range(0, len(shaped), GROUP):
            chunk = shaped[g : g + GROUP]
            scores += [r - (sum(chunk) - r) / (GROUP - 1) for r in chunk]
        adv = [[s * k for k in mr] for s, mr in zip(scores, mask, strict=True)]
    elif est in ("reinforce_plus_plus", "ppo"):
        gamma, lambd = o.get("gamma", 1.0), o.get("lambd", 1.0)
        adv_rows, ret_rows = [], []
        for i, (kr, vr) in enumerate(zip(kl_rows, masked_rows(values, mask), strict=True)):
            tok = [-k for k in kr]
            if tok:
                tok[-1] += rewards[i]
            n = len(tok)
            if est == "reinforce_plus_plus":
                g, rets = 0.0, [0.0] * n
                for k in reversed(range(n)):
                    g = tok[k] + gamma * g
                    rets[k] = g
                adv_rows.append(rets)
                ret_rows.append(rets)
            else:
                a, advs = 0.0, [0.0] * n
                for k in reversed(range(n)):
                    nxt = vr[k + 1] if k + 1 < n else 0.0
                    a = tok[k] + gamma * nxt - vr[k] + gamma * lambd * a
                    advs[k] = a
                adv_rows.append(advs)
                ret_rows.append([a + v for a, v in zip(advs, vr, strict=True)])
        adv, returns = _scatter(adv_rows, mask), _scatter(ret_rows, mask)
        if est == "reinforce_plus_plus":
            adv = whiten_ref(adv, mask)
    else:  # on_policy_distillation: per-token KL shaping of the distillation advantage
        adv = _scatter([[-k for k in kr] for kr in kl_rows], mask)
    if est == "on_policy_distillation" or o.get("use_opd"):
        c = o.get("opd_kl_coef", 1.0)
        adv = [
            [a + c * (tt - ol) * k for a, tt, ol, k in zip(ra, rt, ro, rm, strict=True)]
            for ra, rt, ro, rm in zip(adv, teacher, old, mask, strict=True)
        ]
    if o.get("normalize_advantages"):
        adv = whiten_ref(adv, mask)
    return adv, returns


def _inputs(seed: int, b: int = 12, t_len: int = 6, holes: bool = False):
    rng = random.Random(seed)
    mask = random_mask(rng, b, t_len, empty_rows=2, holes=holes)
    rewards = [float(rng.randint(0, 1)) if seed % 2 else rng.uniform(-1, 1) for _ in range(b)]
    rewards[:GROUP] = [0.5] * GROUP  # one flat group
    old = random_matrix(rng, b, t_len, -3, -0.01)
    return rewards, mask, old, near(rng, old, 0.3), random_matrix(rng, b, t_len, -1, 1), near(rng, old, 0.5)


OPTION_SETS = [
    {},
    {"kl_coef": 0.1},
    {"disable_grpo_std_normalization": True},
    {"disable_rewards_normalization": True, "kl_coef": 0.05},
    {"custom_reward_post_process_path": "x.y"},
    {"normalize_advantages": True},
    {"use_opd": True, "opd_type": "sglang", "opd_kl_coef": 0.7, "kl_coef": 0.05},
    {"gamma": 0.9, "lambd": 0.8, "kl_coef": 0.02},
]


@pytest.mark.parametrize("holes", [False, True])
@pytest.mark.parametrize("options", OPTION_SETS, ids=lambda o: ",".join(o) or "default")
@pytest.mark.parametrize("est", sorted(ESTIMATORS))
def test_estimator_matches_reference(est: str, options: dict, holes: bool) -> None:
    rewards, mask, old, ref, values, teacher = _inputs(len(est) + 7 * len(options), holes=holes)
    out = compute_advantages(
        _cfg(advantage_estimator=est, **options),
        rewards=t(rewards),
        loss_mask=t(mask),
        group_size=GROUP,
        old_log_probs=t(old),
        ref_log_probs=t(ref),
        values=t(values),
        teacher_log_probs=t(teacher),
    )
    adv, returns = _ref(est, options, rewards, mask, old, ref, values, teacher)
    assert torch.allclose(out.advantages, t(adv), atol=1e-9, rtol=0)
    if returns is not None:
        assert torch.allclose(out.returns, t(returns), atol=1e-9, rtol=0)
    assert all(math.isfinite(v) for v in out.metrics.values())


def test_disable_compute_advantages_gives_zeros() -> None:
    rewards, mask, *_ = _inputs(3)
    out = compute_advantages(
        _cfg(disable_compute_advantages_and_returns=True),
        rewards=t(rewards),
        loss_mask=t(mask),
        group_size=GROUP,
    )
    assert out.returns is None and not out.advantages.any()


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"advantage_estimator": "ppo"}, "critic values"),
        ({"kl_coef": 0.1}, "reference log-probs"),
        ({"advantage_estimator": "on_policy_distillation"}, "teacher"),
    ],
)
def test_missing_inputs_are_named(kw: dict, match: str) -> None:
    rewards, mask, *_ = _inputs(1)
    with pytest.raises(ValueError, match=match):
        compute_advantages(_cfg(**kw), rewards=t(rewards), loss_mask=t(mask), group_size=GROUP)


def test_rewards_must_split_into_groups() -> None:
    with pytest.raises(ValueError, match="groups of 4"):
        compute_advantages(_cfg(), rewards=t([1.0] * 6), loss_mask=t([[1.0]] * 6), group_size=4)


@given(st.lists(st.floats(-5, 5), min_size=8, max_size=8), st.booleans())
def test_grpo_advantages_sum_to_zero_per_group(rewards: list[float], dr_grpo: bool) -> None:
    out = compute_advantages(
        _cfg(disable_grpo_std_normalization=dr_grpo),
        rewards=t(rewards),
        loss_mask=torch.ones(8, 1, dtype=torch.float64),
        group_size=4,
    )
    adv = out.advantages[:, 0]
    assert abs(float(adv[:4].sum())) < 1e-6 and abs(float(adv[4:].sum())) < 1e-6


@settings(deadline=None, max_examples=50)
@given(st.integers(0, 10_000), st.sampled_from(sorted(ESTIMATORS)), st.booleans())
def test_advantages_vanish_off_mask_and_stay_finite(seed: int, est: str, holes: bool) -> None:
    rewards, mask, old, ref, values, teacher = _inputs(seed, b=8, t_len=5, holes=holes)
    out = compute_advantages(
        _cfg(advantage_estimator=est, normalize_advantages=seed % 2 == 0),
        rewards=t(rewards),
        loss_mask=t(mask),
        group_size=GROUP,
        old_log_probs=t(old),
        ref_log_probs=t(ref),
        values=t(values),
        teacher_log_probs=t(teacher),
    )
    assert torch.isfinite(out.advantages).all()
    assert not (out.advantages * (1 - t(mask))).any()


@settings(deadline=None, max_examples=50)
@given(st.integers(0, 10_000))
def test_gae_with_unit_gamma_lambda_is_reward_to_go_minus_value(seed: int) -> None:
    rewards, mask, old, ref, values, _ = _inputs(seed, b=8, t_len=5, holes=True)
    out = compute_advantages(
        _cfg(advantage_estimator="ppo", kl_coef=0.1),
        rewards=t(rewards),
        loss_mask=t(mask),
        group_size=GROUP,
        old_log_probs=t(old),
        ref_log_probs=t(ref),
        values=t(values),
    )
    for i in range(8):
        valid = [j for j in range(5) if mask[i][j]]
        token_r = {j: -0.1 * (old[i][j] - ref[i][j]) for j in valid}
        if valid:
            token_r[valid[-1]] += rewards[i]
        for j in valid:
            to_go = sum(token_r[k] for k in valid if k >= j)
            assert abs(float(out.advantages[i, j]) - (to_go - values[i][j])) < 1e-9


@settings(deadline=None, max_examples=30)
@given(st.integers(0, 10_000))
def test_normalize_advantages_whitens_valid_tokens(seed: int) -> None:
    rewards, mask, *_ = _inputs(seed)
    rewards = [r + 0.1 * i for i, r in enumerate(rewards)]
    out = compute_advantages(
        _cfg(normalize_advantages=True), rewards=t(rewards), loss_mask=t(mask), group_size=GROUP
    )
    vals = out.advantages[t(mask) > 0]
    assert abs(float(vals.mean())) < 1e-9 and abs(float(vals.var(unbiased=False)) - 1) < 1e-6
