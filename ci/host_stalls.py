"""Where the GPU waits for the host in a traced region, and what the host was doing meanwhile.

Why: a training step whose kernels add up to 93 ms took 131 ms on the H100 (issue 19): ~40 ms in which no
kernel ran. Kernel tables (``key_averages``) cannot say where that time went; this can. It takes the
traced kernels and the traced CPU operators (with their Python stacks: ``torch.profiler.profile(...,
with_stack=True)``), finds every idle stretch between kernels longer than a launch gap
(`ci.decode_profile.SHORT_GAP_US`), and charges it to what the host was running at the stretch's middle:
the innermost CPU operator open then, and the innermost Python frame of relax or megatron-core under it
(the line that asked for it). Stretches charged to the same place are summed, so the table reads "this
line cost the GPU this much idle time, this often".

The frame needs the profiler to attach Python stacks to its operator events; torch 2.11 on the H100
attached none (every frame came back "-"), so there the operator names alone say where.

The host view is by time, not by launch: an operator that blocks on the device (``.item()``, a host copy)
is charged the wait its own sync caused, which is what a fix would remove.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from ci.decode_profile import SHORT_GAP_US, Interval, _merged

OWN_CODE = ("relax/", "megatron/core/", "ci/")
"""Frames under these paths name the line to blame; library frames (torch, python) are skipped over."""


@dataclass(frozen=True)
class HostOp:
    """One traced CPU operator: its name, [start, end) in µs, and the frame of our code that called it."""

    name: str
    start_us: float
    end_us: float
    frame: str = "-"


def idle_stretches(kernels: list[Interval], short_us: float = SHORT_GAP_US) -> list[tuple[float, float]]:
    """The (start, end) of every stretch between kernels longer than ``short_us``, in time order."""
    spans = _merged(kernels)
    return [(a[1], b[0]) for a, b in zip(spans, spans[1:], strict=False) if b[0] - a[1] > short_us]


def _open_at(ops: list[HostOp], t: float) -> tuple[str, str] | None:
    """(name, frame) of the innermost (shortest) operator open at ``t``; the frame is the innermost one of our
    code among the open operators (CUDA runtime calls carry no Python stack, their callers do)."""
    open_ops = sorted((op for op in ops if op.start_us <= t < op.end_us), key=lambda op: op.end_us - op.start_us)
    if not open_ops:
        return None
    return open_ops[0].name, next((op.frame for op in open_ops if op.frame != "-"), "-")


def charge(kernels: list[Interval], ops: list[HostOp], *, top: int = 15, short_us: float = SHORT_GAP_US) -> dict:
    """Sum the idle stretches by what the host ran at their middle: ``{"idle_s", "stretches", "top": [...]}``,
    each top entry ``{"op", "frame", "count", "idle_ms"}``, largest first."""
    by_place: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0, 0.0])
    stretches = idle_stretches(kernels, short_us)
    for start, end in stretches:
        key = _open_at(ops, (start + end) / 2) or ("(no operator: Python between ops)", "-")
        by_place[key][0] += 1
        by_place[key][1] += end - start
    ranked = sorted(by_place.items(), key=lambda kv: -kv[1][1])[:top]
    return {"idle_s": sum(e - s for s, e in stretches) / 1e6, "stretches": len(stretches), "short_gap_us": short_us,
            "top": [{"op": name[:90], "frame": frame, "count": int(n), "idle_ms": us / 1e3}
                    for (name, frame), (n, us) in ranked]}


def own_frame(stack: list[str] | None) -> str:
    """The innermost frame of our code in a profiler stack (innermost first), shortened to path:line."""
    for frame in stack or ():
        for root in OWN_CODE:
            at = frame.find(root)
            if at >= 0:
                return frame[at:][:120]
    return "-"


def from_profiler(prof) -> tuple[list[Interval], list[HostOp]]:
    """Kernels and CPU operators of a finished ``torch.profiler.profile`` (run with ``with_stack=True``)."""
    from torch.autograd import DeviceType

    kernels, ops = [], []
    for e in prof.events():
        if e.device_type == DeviceType.CUDA:
            kernels.append(Interval(e.name, e.time_range.start, e.time_range.end))
        elif e.device_type == DeviceType.CPU:
            ops.append(HostOp(e.name, e.time_range.start, e.time_range.end, own_frame(e.stack)))
    return kernels, ops


def describe(summary: dict) -> str:
    """A terminal table of the charged places."""
    lines = [f"GPU idle {summary['idle_s'] * 1e3:.1f} ms in {summary['stretches']} stretches "
             f"> {summary['short_gap_us']:g} us; charged to what the host ran at each stretch's middle:"]
    lines += [f"  {t['idle_ms']:7.2f} ms  x{t['count']:<4d} {t['op'][:48]:48s} {t['frame']}" for t in summary["top"]]
    return "\n".join(lines)
