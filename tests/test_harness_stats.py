"""The A/B statistic against a float64 brute force over every permutation (and scipy where installed)."""

from __future__ import annotations

import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.stats import decide, mann_whitney_less, midranks_doubled


def brute_force_p(candidate: list[float], base: list[float]) -> tuple[float, float]:
    """(U, p) by enumerating every split of the pooled runs, U computed from pair counts in float64."""

    def u_stat(xs, ys) -> float:
        return sum(1.0 if x > y else 0.5 if x == y else 0.0 for x in xs for y in ys)

    pooled = [*candidate, *base]
    n = len(candidate)
    observed = u_stat(candidate, base)
    hits = total = 0
    for idx in itertools.combinations(range(len(pooled)), n):
        chosen = set(idx)
        xs = [pooled[i] for i in idx]
        ys = [pooled[i] for i in range(len(pooled)) if i not in chosen]
        total += 1
        hits += u_stat(xs, ys) <= observed + 1e-12
    return observed, hits / total


def test_midranks_share_ties() -> None:
    assert midranks_doubled([3.0, 1.0, 3.0, 2.0]) == [7, 2, 7, 4]  # ranks 3.5, 1, 3.5, 2


def test_fully_separated_five_against_five_is_one_in_252() -> None:
    u, p = mann_whitney_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10])
    assert u == 0 and p == pytest.approx(1 / math.comb(10, 5), rel=1e-15)
    u, p = mann_whitney_less([6, 7, 8, 9, 10], [1, 2, 3, 4, 5])
    assert u == 25 and p == 1.0


@settings(max_examples=60, deadline=None)
@given(candidate=st.lists(st.integers(0, 6), min_size=1, max_size=6),
       base=st.lists(st.integers(0, 6), min_size=1, max_size=6))
def test_exact_p_matches_brute_force_with_ties(candidate: list[int], base: list[int]) -> None:
    u, p = mann_whitney_less([float(x) for x in candidate], [float(x) for x in base])
    ref_u, ref_p = brute_force_p([float(x) for x in candidate], [float(x) for x in base])
    assert u == pytest.approx(ref_u, abs=1e-12)
    assert p == pytest.approx(ref_p, rel=1e-12, abs=1e-15)


def test_matches_scipy_exact_without_ties() -> None:
    stats = pytest.importorskip("scipy.stats")
    cand, base = [101.0, 97.5, 99.1, 103.2, 95.0], [104.0, 98.2, 106.1, 102.3, 107.7]
    ref = stats.mannwhitneyu(cand, base, alternative="less", method="exact")
    u, p = mann_whitney_less(cand, base)
    assert u == ref.statistic and p == pytest.approx(ref.pvalue, rel=1e-12)


def test_decision_is_non_inferiority_at_the_minimum_effect() -> None:
    base = [100.0, 101.0, 99.0, 100.5, 99.5]
    tiny = decide([x * 0.98 for x in base[::-1]], base, alpha=0.05, min_effect=0.10)  # 2% slower, every run
    assert tiny.ok and tiny.slowdown == pytest.approx(0.02)
    assert mann_whitney_less([x * 0.98 for x in base], base)[1] < 0.05  # "slower at all" would be significant
    big = decide([x * 0.7 for x in base], base, alpha=0.05, min_effect=0.10)
    assert not big.ok and big.p == pytest.approx(1 / 252) and big.slowdown == pytest.approx(0.3)
    assert big.statistic() == ("one-sided exact Mann-Whitney test of the candidate against the base's runs x 0.90: "
                               "U = 0, p = 0.003968 (fails when p < 0.05: slower than 90% of the base beyond the noise)")
    edge = decide([x * 0.85 for x in base], base, alpha=0.05, min_effect=0.10)  # 15% slower, no noise: fails
    assert not edge.ok
    noisy = decide([70.0, 130.0, 72.0, 128.0, 71.0], base, alpha=0.05, min_effect=0.10)  # slower median, not beyond noise
    assert noisy.ok and noisy.slowdown > 0.10
    with pytest.raises(ValueError, match="min_effect"):
        decide(base, base, alpha=0.05, min_effect=1.0)


@settings(max_examples=40, deadline=None)
@given(values=st.lists(st.floats(50, 150), min_size=10, max_size=10))
def test_a_commit_never_fails_against_runs_within_the_minimum_effect(values: list[float]) -> None:
    """Whatever the noise, candidate runs that are each at least 90% of some base run cannot all be shown slower
    than 90% of the base: the self-comparison of equal multisets always passes."""
    cand, base = values[:5], values[:5]
    assert decide(cand, base, alpha=0.05, min_effect=0.10).ok
