"""Where the GPU waits for the host in a traced region, and what the host was doing meanwhile.

Why: a training step whose kernels add up to 93 ms took 131 ms on the H100 (issue 19): ~40 ms in which no
kernel ran. Kernel tables (``key_averages``) cannot say where that time went; this can. It takes the
traced kernels and the traced CPU operators, finds every idle stretch between kernels longer than a
launch gap (`ci.decode_profile.SHORT_GAP_US`), and charges it to the innermost host operator open at the
stretch's middle (an autograd function, a compiled region's wrapper, ``cudaStreamSynchronize``...), or
to "Python between operators" when none was open. Stretches charged to the same operator are summed, so
the table reads "the GPU sat idle this long, this often, while the host ran this".

The host view is by time, not by launch: an operator that blocks on the device (``.item()``, a host copy)
is charged the wait its own sync caused, which is what a fix would remove. Python stacks are not
recorded: torch 2.11's profiler attached none to these events on the H100, and recording them slowed the
host work being measured (a 0.119 s step traced in 0.203 s).
"""

from __future__ import annotations

from collections import defaultdict

from ci.decode_profile import SHORT_GAP_US, Interval, idle_gaps

BETWEEN_OPS = "(no operator: Python between ops)"
PHASE = "phase:"  # record_function ranges named so (ci/bench_megatron.py's `phase_ranges`) split the stall by phase


def idle_stretches(kernels: list[Interval], short_us: float = SHORT_GAP_US) -> list[tuple[float, float]]:
    """The (start, end) of every stretch between kernels longer than ``short_us``, in time order."""
    return [(start, end) for start, end in idle_gaps(kernels) if end - start > short_us]


def _open_at(ops: list[Interval], t: float) -> str | None:
    """The name of the innermost (shortest) operator open at ``t``."""
    open_ops = [op for op in ops if op.start_us <= t < op.end_us]
    return min(open_ops, key=lambda op: op.end_us - op.start_us).name if open_ops else None


def charge(kernels: list[Interval], ops: list[Interval], *, top: int = 15, short_us: float = SHORT_GAP_US) -> dict:
    """Sum the idle stretches by the host operator open at their middle: ``{"idle_s", "stretches", "top": [...]}``,
    each top entry ``{"op", "count", "idle_ms"}``, largest first."""
    by_op: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    ops = [op for op in ops if not op.name.startswith(PHASE)]  # a phase range is no operator (`by_phase`)
    stretches = idle_stretches(kernels, short_us)
    for start, end in stretches:
        name = _open_at(ops, (start + end) / 2) or BETWEEN_OPS
        by_op[name][0] += 1
        by_op[name][1] += end - start
    ranked = sorted(by_op.items(), key=lambda kv: -kv[1][1])[:top]
    return {"idle_s": sum(e - s for s, e in stretches) / 1e6, "stretches": len(stretches), "short_gap_us": short_us,
            "top": [{"op": name[:90], "count": int(n), "idle_ms": us / 1e3} for name, (n, us) in ranked]}


def from_profiler(prof) -> tuple[list[Interval], list[Interval]]:
    """Kernels and CPU operators of a finished ``torch.profiler.profile``."""
    from torch.autograd import DeviceType

    kernels, ops = [], []
    for e in prof.events():
        interval = Interval(e.name, e.time_range.start, e.time_range.end)
        if e.device_type == DeviceType.CUDA:
            kernels.append(interval)
        elif e.device_type == DeviceType.CPU:
            ops.append(interval)
    return kernels, ops


def by_phase(kernels: list[Interval], ops: list[Interval], *, short_us: float = SHORT_GAP_US) -> list[dict]:
    """Per ``phase:<name>`` host range (summed over its calls, in first-call order): its wall, the kernels that
    ran inside it and the idle stretches whose middle falls inside it, ``[{"phase", "calls", "wall_ms",
    "kernel_ms", "idle_ms"}]``. Which part of a step (forward, loss, backward, optimizer) the GPU waits in."""
    phases = sorted((op for op in ops if op.name.startswith(PHASE)), key=lambda op: op.start_us)
    stretches = idle_stretches(kernels, short_us)
    out: dict[str, dict] = {}
    for ph in phases:
        row = out.setdefault(ph.name[len(PHASE):], {"phase": ph.name[len(PHASE):], "calls": 0, "wall_ms": 0.0,
                                                     "kernel_ms": 0.0, "idle_ms": 0.0})
        row["calls"] += 1
        row["wall_ms"] += (ph.end_us - ph.start_us) / 1e3
        row["kernel_ms"] += sum(min(k.end_us, ph.end_us) - max(k.start_us, ph.start_us) for k in kernels
                                if k.end_us > ph.start_us and k.start_us < ph.end_us) / 1e3
        row["idle_ms"] += sum(e - s for s, e in stretches if ph.start_us <= (s + e) / 2 < ph.end_us) / 1e3
    return list(out.values())


def describe_phases(rows: list[dict]) -> str:
    lines = ["per phase (host range): wall, kernels inside it, GPU idle stretches inside it"]
    lines += [f"  {r['phase']:<12} x{r['calls']:<3d} wall {r['wall_ms']:7.2f} ms  kernels {r['kernel_ms']:7.2f} ms  "
              f"idle {r['idle_ms']:7.2f} ms" for r in rows]
    return "\n".join(lines)


def describe(summary: dict) -> str:
    """A terminal table of the charged operators."""
    lines = [f"GPU idle {summary['idle_s'] * 1e3:.1f} ms in {summary['stretches']} stretches "
             f"> {summary['short_gap_us']:g} us; charged to the host operator open at each stretch's middle:"]
    lines += [f"  {t['idle_ms']:7.2f} ms  x{t['count']:<4d} {t['op']}" for t in summary["top"]]
    return "\n".join(lines)
