"""``--balance-data``: deal one optimizer step's micro-batches to the data-parallel ranks by token count.

Round robin gives a rank whose micro-batches happen to be long more work than the others, and the
step waits for it. The largest differencing method (Karmarkar-Karp, k-way) splits the micro-batches'
costs (padded tokens: rows x longest sequence) into one subset per rank with near-equal sums. Every
rank computes the same split from the same inputs, so no communication is needed; the gradient is
the same sum of the same terms as with round robin (float addition order aside).
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence


def karmarkar_karp(costs: Sequence[float], k: int) -> list[list[int]]:
    """Indices of ``costs`` split into ``k`` lists with near-equal sums (each index once, deterministic)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    heap: list[tuple[float, int, list[tuple[float, list[int]]]]] = []
    for i, cost in enumerate(costs):  # a partition: k (sum, indices) subsets, largest sum first
        subsets = [(float(cost), [i])] + [(0.0, []) for _ in range(k - 1)]
        heapq.heappush(heap, (-float(cost), i, subsets))
    if not heap:
        return [[] for _ in range(k)]
    counter = len(costs)
    while len(heap) > 1:  # merge the two most unbalanced partitions, big subsets with small ones
        _, _, a = heapq.heappop(heap)
        _, _, b = heapq.heappop(heap)
        merged = [(sa + sb, ia + ib) for (sa, ia), (sb, ib) in zip(a, reversed(b), strict=True)]
        merged.sort(key=lambda s: (-s[0], min(s[1], default=-1)))
        heapq.heappush(heap, (-(merged[0][0] - merged[-1][0]), counter, merged))
        counter += 1
    return [sorted(indices) for _, indices in heap[0][2]]
