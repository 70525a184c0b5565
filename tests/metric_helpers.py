"""Comparing the metrics of two training runs."""

from __future__ import annotations


def no_timings(metrics: dict[str, float]) -> dict[str, float]:
    """``metrics`` without the ``perf/`` phase timings, which differ from run to run (for equality checks)."""
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}
