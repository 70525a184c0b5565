"""Where a decode run's time goes: GPU-busy share of the wall time and the kernels that fill it.

``ci/bench_engine.py --profile`` runs one more ``generate`` of each engine row under torch.profiler
and stores this summary in the row. The question it answers for issue 19 is the first one to ask
before optimizing decode: is the GPU idle between steps (host-bound: scheduling, sampling read-back,
Python), or busy with kernels, and which ones (attention over the KV cache, the GEMMs, sampling)?

``busy_s`` is the union of kernel intervals (overlapping kernels on several streams count once), so
``busy_share = busy_s / wall_s`` is the fraction of the wall time in which some kernel ran. Kernels
inside CUDA-graph replays are traced by CUPTI like any other. The idle time between kernels is split
into short gaps (<= ``SHORT_GAP_US``: the launch latency between back-to-back kernels, which a graph
of hundreds of kernels pays hundreds of times per step) and long ones (the GPU waiting for the host),
because the two call for different fixes: fewer kernels, or less host work per step.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

TOP = 15
SHORT_GAP_US = 10.0
"""Idle gaps up to this long between kernels are counted as launch gaps, longer ones as waiting for the host."""


@dataclass(frozen=True)
class Interval:
    """One traced kernel (or, on the CPU, one operator): its name and its [start, end) in microseconds."""

    name: str
    start_us: float
    end_us: float


def _merged(intervals: Iterable[Interval]) -> list[tuple[float, float]]:
    """The intervals' union as disjoint (start, end) spans in time order."""
    spans: list[list[float]] = []
    for iv in sorted(intervals, key=lambda i: i.start_us):
        if spans and iv.start_us <= spans[-1][1]:
            spans[-1][1] = max(spans[-1][1], iv.end_us)
        else:
            spans.append([iv.start_us, iv.end_us])
    return [(start, end) for start, end in spans]


def union_us(intervals: Iterable[Interval]) -> float:
    """Total length of the union of the intervals (µs)."""
    return sum(end - start for start, end in _merged(intervals))


def idle_gaps(intervals: Iterable[Interval]) -> list[tuple[float, float]]:
    """The (start, end) of every idle stretch between the first and the last kernel, in time order."""
    spans = _merged(intervals)
    return [(prev[1], nxt[0]) for prev, nxt in zip(spans, spans[1:], strict=False)]


def idle_gaps_us(intervals: Iterable[Interval], short_us: float = SHORT_GAP_US) -> tuple[float, float, int]:
    """Idle time between the first and the last kernel, split at ``short_us``: (short gaps µs, long gaps µs,
    number of long gaps). Short gaps are the launch latency between back-to-back kernels (inside a CUDA graph
    too); long ones are the GPU waiting for the host."""
    gaps = [end - start for start, end in idle_gaps(intervals)]
    long = [g for g in gaps if g > short_us]
    return sum(g for g in gaps if g <= short_us), sum(long), len(long)


def long_gaps_after(kernels: list[Interval], *, short_us: float = SHORT_GAP_US, top: int = TOP) -> list[dict]:
    """The long gaps (> ``short_us``) summed by the kernel that ran last before each: where in a step the GPU
    waits (after a CUDA graph's last kernel: between replays; after a host copy: on the host's read-back).
    ``[{"after", "count", "idle_ms"}]``, largest first."""
    ends = sorted(kernels, key=lambda k: k.end_us)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    j, last = 0, None
    for start, end in idle_gaps(kernels):
        while j < len(ends) and ends[j].end_us <= start:
            last = ends[j]
            j += 1
        if end - start > short_us and last is not None:
            by_name[last.name][0] += 1
            by_name[last.name][1] += end - start
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    return [{"after": name[:160], "count": int(n), "idle_ms": us / 1e3} for name, (n, us) in ranked]


def summarize(kernels: list[Interval], wall_s: float, *, top: int = TOP) -> dict:
    """The busy share, the ``top`` kernel names by total time (count, total ms, share of kernel time) and the long
    gaps by the kernel that ran before them (`long_gaps_after`)."""
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        by_name[k.name][0] += 1
        by_name[k.name][1] += k.end_us - k.start_us
    kernel_us = sum(total for _, total in by_name.values())
    busy_us = union_us(kernels)
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][1])[:top]
    short, long, stalls = idle_gaps_us(kernels)
    return {"wall_s": wall_s, "busy_s": busy_us / 1e6, "busy_share": busy_us / 1e6 / wall_s if wall_s else None,
            "kernels": len(kernels), "kernel_s": kernel_us / 1e6,
            "short_gaps_s": short / 1e6, "long_gaps_s": long / 1e6, "long_gaps": stalls,
            "short_gap_us": SHORT_GAP_US, "gaps_after": long_gaps_after(kernels, top=top),
            "top": [{"name": name[:160], "count": int(count), "total_ms": total / 1e3,
                     "share": total / kernel_us if kernel_us else None} for name, (count, total) in ranked]}


def profile(fn: Callable[[], object], device: str,
            host: Callable[[list[Interval], list[Interval]], dict] | None = None) -> dict:
    """Run ``fn`` once under torch.profiler; on CUDA the kernels, on the CPU the top-level operators. ``host``
    (CUDA): called with the kernels and the traced CPU operators, its dict stored as ``host_at_gaps``
    (`ci.host_stalls.charge`: what the host ran while the GPU waited)."""
    import torch
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch_profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        wall = time.perf_counter() - t0
    want = DeviceType.CUDA if cuda else DeviceType.CPU
    events = [e for e in prof.events() if e.device_type == want and (cuda or e.cpu_parent is None)]
    kernels = [Interval(e.name, e.time_range.start, e.time_range.end) for e in events]
    out = {"device": device, "what": "CUDA kernels" if cuda else "top-level CPU operators", **summarize(kernels, wall)}
    if cuda and host is not None:
        ops = [Interval(e.name, e.time_range.start, e.time_range.end) for e in prof.events()
               if e.device_type == DeviceType.CPU]
        out["host_at_gaps"] = host(kernels, ops)
    return out


def describe(summary: dict, *, top: int = 5) -> str:
    """Two lines for a terminal: the busy share and the heaviest kernels."""
    busy = summary.get("busy_share")
    head = (f"{summary['what']}: {summary['kernels']} in {summary['wall_s']:.3f} s, busy "
            f"{'-' if busy is None else f'{busy:.0%}'} of the wall time")
    if "short_gaps_s" in summary:
        head += (f"; idle between kernels {summary['short_gaps_s']:.3f} s in gaps <= {summary['short_gap_us']:g} us "
                 f"(launch), {summary['long_gaps_s']:.3f} s in {summary['long_gaps']} longer ones (host)")
    if summary.get("busy_share_of_timed_run") is not None:
        head += f" ({summary['busy_share_of_timed_run']:.0%} of the untraced run's {summary['timed_wall_s']:.3f} s)"
    heavy = ", ".join(f"{k['name'][:48]} {k['total_ms']:.1f} ms ({k['share']:.0%})"
                      for k in summary["top"][:top] if k["share"] is not None)
    return f"{head}\n    heaviest: {heavy or '-'}"
