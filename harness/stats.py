"""The A/B gate's statistic: a one-sided Mann-Whitney U test, exact, against a minimum effect size.

``p = P(U <= u_observed)`` under H0 ("the candidate's throughput has the base's distribution"), where
``U`` counts the (candidate, base) pairs in which the candidate is faster (ties count one half). The null
distribution is the exact permutation distribution of the candidate's rank sum over every way of picking
its ``n`` places among the ``n + m`` pooled runs, with tied runs sharing their mid-rank; counted with
integers (a subset-sum table over doubled ranks), so it is exact with ties too. With 5 runs a side the
smallest reachable p is 1/252.

The minimum effect enters the test itself (a non-inferiority test): the candidate is compared with the
base's runs scaled by ``1 - min_effect``, so the gate fails only when the candidate is slower than 90% (by
default) of the base *beyond the measured noise*. A real but tiny slowdown (1%) never fails it, however many
runs; and a noisy machine, where two runs of one commit differ by 20%, makes p large instead of failing a
change by chance (testing "slower at all" and then requiring a 10% median gap fails a self-comparison on
such a machine whenever the noise happens to line up).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from fractions import Fraction


def midranks_doubled(values: list[float]) -> list[int]:
    """2 x the mid-rank (1-based) of each value in ``values``: integers even with ties."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + 1) + (j + 1)  # 2 x mean of ranks i+1 .. j+1
        i = j + 1
    return ranks


def rank_sum_distribution(doubled: list[int], n: int) -> dict[int, int]:
    """doubled rank sum -> number of n-subsets of ``doubled`` with that sum."""
    table: list[dict[int, int]] = [{0: 1}] + [{} for _ in range(n)]
    for r in doubled:
        for j in range(n, 0, -1):
            row = table[j]
            for s, ways in table[j - 1].items():
                row[s + r] = row.get(s + r, 0) + ways
    return table[n]


def mann_whitney_less(candidate: list[float], base: list[float]) -> tuple[float, float]:
    """(U of the candidate, exact one-sided p that the candidate is stochastically smaller)."""
    n, m = len(candidate), len(base)
    if n < 1 or m < 1:
        raise ValueError(f"need runs on both sides, got {n} candidate and {m} base")
    doubled = midranks_doubled([*candidate, *base])
    observed = sum(doubled[:n])
    dist = rank_sum_distribution(doubled, n)
    at_most = sum(ways for s, ways in dist.items() if s <= observed)
    p = Fraction(at_most, math.comb(n + m, n))
    u = observed / 2 - n * (n + 1) / 2
    return u, float(p)


@dataclass(frozen=True)
class ABDecision:
    ok: bool
    p: float
    u: float
    slowdown: float  # 1 - median(candidate) / median(base), reported; negative: faster
    alpha: float
    min_effect: float

    def statistic(self) -> str:
        return (f"one-sided exact Mann-Whitney test of the candidate against the base's runs x "
                f"{1 - self.min_effect:.2f}: U = {self.u:g}, p = {self.p:.4g} (fails when p < {self.alpha:g}: "
                f"slower than {1 - self.min_effect:.0%} of the base beyond the noise)")


def decide(candidate: list[float], base: list[float], alpha: float, min_effect: float) -> ABDecision:
    """Throughputs (higher is better) of the candidate's and the base's runs -> pass / fail."""
    if not 0 <= min_effect < 1:
        raise ValueError(f"min_effect {min_effect} must be in [0, 1)")
    u, p = mann_whitney_less(candidate, [b * (1 - min_effect) for b in base])
    slowdown = 1.0 - statistics.median(candidate) / statistics.median(base)
    return ABDecision(ok=p >= alpha, p=p, u=u, slowdown=slowdown, alpha=alpha, min_effect=min_effect)
