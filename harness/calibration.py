"""In-run CPU calibration: a fixed matmul timed in the same job as the scenarios.

CPU throughput numbers are divided by this machine's speed on a fixed piece of work, so a
baseline recorded on one CI machine is comparable on another (and on a busy shared one).
``normalized tokens/s = tokens/s * calibration_s``; ``normalized step time = step_s / calibration_s``.
"""

from __future__ import annotations

import functools
import statistics
import time

SIZE = 256
REPEATS = 20
TRIALS = 7


def _torch_unit() -> float:
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(SIZE, SIZE, generator=gen)
        b = torch.randn(SIZE, SIZE, generator=gen)
        times = []
        for _ in range(TRIALS):
            t0 = time.perf_counter()
            for _ in range(REPEATS):
                a = torch.tanh(a @ b)
            times.append(time.perf_counter() - t0)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def _python_unit() -> float:
    n = 48
    a = [[(i * j) % 7 / 7.0 for j in range(n)] for i in range(n)]
    times = []
    for _ in range(TRIALS):
        t0 = time.perf_counter()
        [[sum(x * y for x, y in zip(row, col, strict=True)) for col in zip(*a, strict=True)] for row in a]
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure() -> float:
    """Seconds for the fixed unit of work (median of several trials, one thread)."""
    try:
        return _torch_unit()
    except ImportError:
        return _python_unit()


@functools.cache
def calibration_s() -> float:
    """Measured once per process (the 'job')."""
    return measure()
