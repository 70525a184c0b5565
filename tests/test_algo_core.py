"""GRPO advantages, PPO-clip loss, KL estimators and reductions against plain float64 references.

References are written with Python loops over lists, sharing no code with relax.algorithms.
"""

from __future__ import annotations

import math
import random
from argparse import Namespace

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.algorithms import AlgorithmConfig, compute_advantages, policy_loss
from relax.algorithms.kl import kl_estimate


def _cfg(**kw) -> AlgorithmConfig:
    base = dict(advantage_estimator="grpo", disable_grpo_std_normalization=False, disable_rewards_normalization=False,
                normalize_advantages=False, eps_clip=0.2, eps_clip_high=None, eps_clip_c=None, entropy_coef=0.0,
                use_kl_loss=False, kl_loss_coef=0.0, kl_loss_type="k1", calculate_per_token_loss=False)
    base.update(kw)
    return AlgorithmConfig.from_args(Namespace(**base))


def _random_batch(seed: int, b: int = 6, t: int = 5, empty_row: bool = True):
    rng = random.Random(seed)
    lengths = [rng.randint(1, t) for _ in range(b)]
    if empty_row:
        lengths[1] = 0
    mask = [[1.0 if j < n else 0.0 for j in range(t)] for n in lengths]
    lp = [[rng.uniform(-3, -0.01) for _ in range(t)] for _ in range(b)]
    old = [[x + rng.uniform(-0.4, 0.4) for x in row] for row in lp]
    adv = [[rng.uniform(-2, 2) for _ in range(t)] for _ in range(b)]
    return lp, old, adv, mask


def _ref_grpo(rewards: list[float], group: int, std: bool) -> list[float]:
    out = []
    for g in range(0, len(rewards), group):
        chunk = rewards[g : g + group]
        mean = sum(chunk) / len(chunk)
        var = sum((r - mean) ** 2 for r in chunk) / len(chunk)
        out += [(r - mean) / (math.sqrt(var) + 1e-6) if std else r - mean for r in chunk]
    return out


def _ref_pg(lp, old, adv, mask, eps_lo, eps_hi, c, per_token: bool, num_samples: int):
    loss_rows, total, tokens = [], 0.0, 0.0
    for i in range(len(lp)):
        row_sum, n = 0.0, 0.0
        for j in range(len(lp[i])):
            if not mask[i][j]:
                continue
            r = math.exp(lp[i][j] - old[i][j])
            a = adv[i][j]
            loss = max(-a * r, -a * min(max(r, 1 - eps_lo), 1 + eps_hi))
            if c is not None and a < 0:
                loss = min(loss, -a * c)
            row_sum += loss
            n += 1
        loss_rows.append((row_sum, n))
        total += row_sum
        tokens += n
    if per_token:
        return total / max(tokens, 1)
    return sum(s / n for s, n in loss_rows if n) / num_samples


def _t(x) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float64)


@pytest.mark.parametrize("std", [True, False])
@pytest.mark.parametrize("seed", range(3))
def test_grpo_advantages_match_reference(std: bool, seed: int) -> None:
    rng = random.Random(seed)
    rewards = [float(rng.randint(0, 1)) if seed else rng.uniform(-1, 1) for _ in range(12)]
    _, _, _, mask = _random_batch(seed, b=12)
    out = compute_advantages(_cfg(disable_grpo_std_normalization=not std), rewards=_t(rewards), loss_mask=_t(mask),
                             group_size=4)
    expected = _ref_grpo(rewards, 4, std)
    for i in range(12):
        for j in range(5):
            assert abs(float(out.advantages[i, j]) - expected[i] * mask[i][j]) < 1e-9


@given(st.lists(st.floats(-5, 5), min_size=8, max_size=8))
def test_grpo_advantages_sum_to_zero_per_group(rewards: list[float]) -> None:
    mask = torch.ones(8, 1, dtype=torch.float64)
    adv = compute_advantages(_cfg(), rewards=_t(rewards), loss_mask=mask, group_size=4).advantages[:, 0]
    assert abs(float(adv[:4].sum())) < 1e-6 and abs(float(adv[4:].sum())) < 1e-6


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("dual_clip", [None, 3.0])
@pytest.mark.parametrize("seed", range(3))
def test_policy_loss_matches_reference(per_token: bool, dual_clip: float | None, seed: int) -> None:
    lp, old, adv, mask = _random_batch(seed)
    cfg = _cfg(eps_clip=0.2, eps_clip_high=0.28, eps_clip_c=dual_clip, calculate_per_token_loss=per_token)
    tokens = int(sum(map(sum, mask)))
    loss, metrics = policy_loss(cfg, log_probs=_t(lp), old_log_probs=_t(old), advantages=_t(adv), loss_mask=_t(mask),
                                num_global_samples=len(lp), num_global_tokens=tokens)
    expected = _ref_pg(lp, old, adv, mask, 0.2, 0.28, dual_clip, per_token, len(lp))
    assert abs(float(loss) - expected) < 1e-10
    assert abs(float(metrics["pg_loss"]) - expected) < 1e-10


@settings(deadline=None)
@given(st.integers(0, 10_000))
def test_ratio_one_gives_minus_mean_advantage(seed: int) -> None:
    lp, _, adv, mask = _random_batch(seed)
    loss, m = policy_loss(_cfg(), log_probs=_t(lp), old_log_probs=_t(lp), advantages=_t(adv), loss_mask=_t(mask),
                          num_global_samples=len(lp), num_global_tokens=1)
    per_sample = [sum(a * k for a, k in zip(ar, mr, strict=True)) / sum(mr) for ar, mr in zip(adv, mask, strict=True) if sum(mr)]
    assert abs(float(loss) + sum(per_sample) / len(lp)) < 1e-10
    assert float(m["ppo_kl"]) == 0.0 and float(m["pg_clipfrac"]) == 0.0


@settings(deadline=None)
@given(st.integers(0, 10_000), st.floats(1.5, 10))
def test_dual_clip_bounds_negative_advantage_loss(seed: int, c: float) -> None:
    lp, old, adv, mask = _random_batch(seed, empty_row=False)
    lp = [[x + 3.0 for x in row] for row in lp]  # large ratios
    adv = [[-abs(a) for a in row] for row in adv]
    cfg = _cfg(eps_clip_c=c, calculate_per_token_loss=True)
    for i in range(len(lp)):
        for j in range(len(lp[i])):
            if not mask[i][j]:
                continue
            one = lambda x: _t([[x]])  # noqa: E731
            loss, _ = policy_loss(cfg, log_probs=one(lp[i][j]), old_log_probs=one(old[i][j]), advantages=one(adv[i][j]),
                                  loss_mask=one(1.0), num_global_samples=1, num_global_tokens=1)
            assert float(loss) <= -adv[i][j] * c + 1e-9


@settings(deadline=None)
@given(st.lists(st.floats(-20, 0), min_size=4, max_size=4), st.lists(st.floats(-20, 0), min_size=4, max_size=4))
def test_kl_estimators(lp: list[float], ref: list[float]) -> None:
    for kind in ("k1", "k2", "k3", "low_var_kl"):
        got = kl_estimate(_t(lp), _t(ref), kind)
        for g, a, b in zip(got.tolist(), lp, ref, strict=True):
            d = a - b
            expected = {"k1": d, "k2": d * d / 2, "k3": math.exp(-d) - 1 + d,
                        "low_var_kl": min(max(math.exp(-d) - 1 + d, -10), 10)}[kind]
            assert abs(g - expected) <= 1e-9 * max(1.0, abs(expected))
            if kind in ("k2", "k3", "low_var_kl"):
                assert g >= 0


def test_kl_loss_and_entropy_terms() -> None:
    lp, old, adv, mask = _random_batch(4)
    ref = [[x - 0.1 for x in row] for row in lp]
    ent = [[0.5 + 0.1 * j for j in range(5)] for _ in lp]
    cfg = _cfg(use_kl_loss=True, kl_loss_coef=0.3, kl_loss_type="k3", entropy_coef=0.02)
    loss, m = policy_loss(cfg, log_probs=_t(lp), old_log_probs=_t(old), advantages=_t(adv), loss_mask=_t(mask),
                          ref_log_probs=_t(ref), entropy=_t(ent), num_global_samples=len(lp), num_global_tokens=1)

    def sample_mean(values):
        rows = [sum(v * k for v, k in zip(vr, mr, strict=True)) / sum(mr) for vr, mr in zip(values, mask, strict=True) if sum(mr)]
        return sum(rows) / len(lp)

    k3 = [[math.exp(-(a - b)) - 1 + (a - b) for a, b in zip(ra, rb, strict=True)] for ra, rb in zip(lp, ref, strict=True)]
    expected = _ref_pg(lp, old, adv, mask, 0.2, 0.2, None, False, len(lp)) + 0.3 * sample_mean(k3) - 0.02 * sample_mean(ent)
    assert abs(float(loss) - expected) < 1e-10
    assert abs(float(m["kl_loss"]) - sample_mean(k3)) < 1e-10


@pytest.mark.parametrize("per_token", [False, True])
@pytest.mark.parametrize("splits", [1, 2, 3, 6])
def test_micro_batch_sums_equal_full_batch(per_token: bool, splits: int) -> None:
    lp, old, adv, mask = _random_batch(9, b=6)
    cfg = _cfg(calculate_per_token_loss=per_token)
    tokens = int(sum(map(sum, mask)))
    full, full_m = policy_loss(cfg, log_probs=_t(lp), old_log_probs=_t(old), advantages=_t(adv), loss_mask=_t(mask),
                               num_global_samples=6, num_global_tokens=tokens)
    size = 6 // splits
    total, kl = 0.0, 0.0
    for s in range(0, 6, size):
        sl = slice(s, s + size)
        part, m = policy_loss(cfg, log_probs=_t(lp[sl]), old_log_probs=_t(old[sl]), advantages=_t(adv[sl]),
                              loss_mask=_t(mask[sl]), num_global_samples=6, num_global_tokens=tokens)
        total += float(part)
        kl += float(m["ppo_kl"])
    assert abs(total - float(full)) < 1e-12 and abs(kl - float(full_m["ppo_kl"])) < 1e-12


def test_eps_clip_c_must_exceed_one() -> None:
    with pytest.raises(ValueError, match="--eps-clip-c must be > 1"):
        _cfg(eps_clip_c=0.5)
