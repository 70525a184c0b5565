"""Programmatic dependent launch (PDL) for the decode step's kernels on Hopper and newer GPUs.

A kernel launched with PDL may start while the kernel before it in the stream is still running: its
programs become resident and stop in ``gdc_wait`` until the previous grid has completed and its writes
are visible, so a kernel's launch and ramp overlap its predecessor's tail. In the decode step (~180
kernels of a few microseconds each at batch 64) those fixed costs are much of the time. The rule every
relax kernel launched this way keeps: ``gdc_wait`` before it loads anything its predecessor may write,
``gdc_launch_dependents`` only after it, so when a kernel starts, everything before its predecessor has completed
(and its writes are visible). What only kernels before the predecessor write, or none of this step, a kernel may
load before the wait: the attention kernel loads its row's position and first cache block there. The lean runner's
compiled decode forward follows inductor's own PDL codegen (``triton.enable_pdl``); so do the LM head (the skinny
GEMM, `triton_linear`) and the unfiltered sampler's two Triton kernels (`triton_sample`), launched with PDL like the
other relax kernels; with ``RELAX_DECODE_HEAD=0`` the head is cuBLAS's GEMM, which takes no part in PDL, and what
follows it (the compiled sampler and store) starts after it. (A first reading that the codegen made the
sampler's reductions ~7x slower was inductor's on-disk cache serving another model's sampler: see the lean
runner's ``_compile_over_rows``.)

``RELAX_DECODE_PDL=0`` in the engine's environment turns it off (an A/B, or a driver that mishandles it).
"""

from __future__ import annotations

import functools
import os

import torch


@functools.cache
def pdl_available(device: torch.device) -> bool:
    """A CUDA device of compute capability 9 or newer and a Triton that has ``gdc_wait`` (3.4+), unless
    ``RELAX_DECODE_PDL=0``."""
    if os.environ.get("RELAX_DECODE_PDL", "1") == "0":
        return False
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] < 9:
        return False
    try:
        from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait  # noqa: F401
    except ImportError:
        return False
    return True


def compile_options(device: torch.device, mode: str | None) -> dict:
    """``torch.compile`` keyword arguments for the decode step: ``mode`` when one is asked for (torch.compile takes
    a mode or options, not both), else inductor's PDL codegen where PDL is available. (Inductor's
    ``emulate_precision_casts`` here too, as for the prefill, raised the H100's log-prob mismatch: 8.88e-3 against
    8.67e-3 at 0370a2f, docs/performance.md.)"""
    if mode is not None or not pdl_available(device):
        return {"mode": mode}
    return {"options": {"triton.enable_pdl": True}}
