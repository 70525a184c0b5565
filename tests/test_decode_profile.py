"""ci/decode_profile.py: the busy time is the union of the kernel intervals (checked against a brute-force
count over a microsecond grid), and the summary ranks kernels by their total time."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from ci.decode_profile import Interval, describe, idle_gaps_us, long_gaps_after, summarize, union_us

spans = st.lists(st.tuples(st.integers(0, 200), st.integers(0, 40)), max_size=25)


@given(spans)
def test_union_equals_a_brute_force_count(raw: list[tuple[int, int]]) -> None:
    intervals = [Interval("k", s, s + d) for s, d in raw]
    covered = {t for s, d in raw for t in range(s, s + d)}
    assert union_us(intervals) == len(covered)


def test_summary_ranks_kernels_and_counts_overlap_once() -> None:
    kernels = [Interval("gemm", 0, 60), Interval("attn", 50, 80), Interval("gemm", 100, 140), Interval("topk", 150, 155)]
    s = summarize(kernels, wall_s=200e-6)
    assert s["busy_s"] == pytest.approx(125e-6) and s["kernel_s"] == pytest.approx(135e-6)  # 10 us overlap once
    assert s["busy_share"] == pytest.approx(125 / 200)
    assert [(k["name"], k["count"], k["total_ms"]) for k in s["top"]] == [("gemm", 2, pytest.approx(0.1)),
                                                                          ("attn", 1, pytest.approx(0.03)),
                                                                          ("topk", 1, pytest.approx(0.005))]
    assert "busy 62% of the wall time" in describe({"what": "CUDA kernels", **s})
    assert summarize([], 1.0)["busy_share"] == 0.0 and summarize([], 0.0)["busy_share"] is None


@given(spans)
def test_idle_gaps_add_up_to_the_span_minus_the_busy_time(raw: list[tuple[int, int]]) -> None:
    intervals = [Interval("k", s, s + d) for s, d in raw if d > 0]
    short, long, count = idle_gaps_us(intervals, short_us=10)
    if not intervals:
        assert (short, long, count) == (0, 0, 0)
        return
    span = max(i.end_us for i in intervals) - min(i.start_us for i in intervals)
    assert short + long == pytest.approx(span - union_us(intervals))
    assert count <= len(intervals) - 1 and (count == 0) == (long == 0)


def test_short_gaps_are_launch_latency_and_long_ones_host_stalls() -> None:
    kernels = [Interval("a", 0, 10), Interval("b", 12, 20), Interval("c", 60, 70), Interval("d", 71, 80)]
    assert idle_gaps_us(kernels, short_us=10) == (3, 40, 1)
    s = summarize(kernels, wall_s=100e-6)
    assert (s["short_gaps_s"], s["long_gaps_s"], s["long_gaps"]) == (pytest.approx(3e-6), pytest.approx(40e-6), 1)


def test_long_gaps_are_charged_to_the_kernel_that_ended_last_before_them() -> None:
    # "copy" ends before "gemm" (which overlaps it) ends: the gap after them belongs to "gemm", the one that ended last
    kernels = [Interval("copy", 0, 10), Interval("gemm", 5, 20), Interval("attn", 50, 60), Interval("gemm", 62, 70),
               Interval("copy", 70, 75), Interval("attn", 95, 100)]
    assert long_gaps_after(kernels, short_us=10) == [{"after": "gemm", "count": 1, "idle_ms": pytest.approx(0.03)},
                                                     {"after": "copy", "count": 1, "idle_ms": pytest.approx(0.02)}]
    assert summarize(kernels, 1e-4)["gaps_after"][0]["after"] == "gemm"
    assert long_gaps_after([]) == []
