"""ci/host_stalls.py: idle stretches between kernels are charged to the innermost host operator open at their
middle, or to Python between operators when none is open."""

from __future__ import annotations

from ci.decode_profile import Interval
from ci.host_stalls import BETWEEN_OPS, charge, describe, idle_stretches


def test_only_stretches_longer_than_a_launch_gap_count() -> None:
    kernels = [Interval("a", 0, 10), Interval("b", 12, 20), Interval("c", 5, 15), Interval("d", 120, 130)]
    assert idle_stretches(kernels, short_us=10) == [(20, 120)]  # 10->12 is short; a and c overlap


def test_stretches_are_charged_to_the_innermost_operator_open_at_their_middle() -> None:
    kernels = [Interval("k", 0, 10), Interval("k", 110, 120), Interval("k", 150, 160), Interval("k", 400, 410)]
    ops = [Interval("aten::item", 0, 130), Interval("cudaStreamSynchronize", 20, 100), Interval("aten::copy_", 200, 300)]
    out = charge(kernels, ops, short_us=10)
    assert out["stretches"] == 3 and abs(out["idle_s"] - (100 + 30 + 240) / 1e6) < 1e-12
    top = {t["op"]: (t["count"], t["idle_ms"]) for t in out["top"]}
    assert top["cudaStreamSynchronize"] == (1, 0.1)  # inside aten::item: the innermost one
    assert top["aten::copy_"] == (1, 0.24)
    assert top[BETWEEN_OPS] == (1, 0.03)  # 120..150: its middle is outside every op
    assert out["top"][0]["op"] == "aten::copy_"  # largest first
    assert "aten::copy_" in describe(out)
