"""Device profiles, the machine class a measurement belongs to, and the numeric tolerances per precision.

Numeric tolerances follow the dtypes a run really computes in (``run.json`` ``dtypes``, written by the
engine), not the device: an fp32 pair gets fp32 tolerances on a GPU too, and a pair with a bf16 side
gets the stated bf16 ones. Throughput tolerances are per profile (the smallest drop that may fail).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path


class Profile(StrEnum):
    CPU = "cpu"
    GPU = "gpu"


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"


_DTYPES = {"float32": Precision.FP32, "fp32": Precision.FP32, "bfloat16": Precision.BF16, "bf16": Precision.BF16,
           "float16": Precision.BF16, "fp16": Precision.BF16}  # fp16 rounds like bf16 for our purposes (~1e-3)


@dataclass(frozen=True)
class Tolerances:
    parity_rtol: float
    parity_atol: float
    rollout_kl_max: float  # step 0: |mean(rollout log-prob - trainer log-prob)|
    logprob_abs_diff_mean_max: float  # mean |trainer - rollout| over a step's response tokens
    logprob_abs_diff_max: float  # max (fp32) or p99 (bf16) over every response token of a step
    worst_token_key: str  # which per-step statistic logprob_abs_diff_max bounds


TOLERANCES: dict[Precision, Tolerances] = {
    # fp32 on either device: the same kernels up to summation order. Measured on CPU (tiny-qwen3, 24-token
    # responses): max |diff| 9.5e-7 over every token, |step-0 kl| < 1e-8; bounds leave 100x room.
    Precision.FP32: Tolerances(parity_rtol=0.0, parity_atol=1e-6, rollout_kl_max=1e-5,
                               logprob_abs_diff_mean_max=1e-5, logprob_abs_diff_max=1e-4,
                               worst_token_key="train/train_rollout_logprob_abs_diff_max"),
    # bf16: stated looser bounds. Engine (KV-cache decode) vs trainer (full forward) on an H100: mean 6.8e-3 -
    # 9.7e-3, max 3.3e-2 - 5.5e-2 per token (docs/performance.md); one bf16 ulp near |log p| ~ 4 is 1.6e-2.
    Precision.BF16: Tolerances(parity_rtol=2e-2, parity_atol=1e-2, rollout_kl_max=2e-2,
                               logprob_abs_diff_mean_max=2e-2, logprob_abs_diff_max=1e-1,
                               worst_token_key="train/train_rollout_logprob_abs_diff_p99"),
}

# The smallest relative throughput drop that may fail a stored-baseline comparison (a baseline's spread can
# widen it): a shared 2-core CI machine drifts with its neighbours; a GPU run is steadier.
THROUGHPUT_MIN_TOLERANCE: dict[Profile, float] = {Profile.CPU: 0.35, Profile.GPU: 0.10}


def precision_of(dtypes: dict[str, str] | None) -> Precision:
    """The coarsest precision among a run's dtypes (run.json ``dtypes``: {"trainer": ..., "engine": ...})."""
    if not dtypes:
        raise ValueError("run.json has no 'dtypes': cannot choose numeric tolerances (state them in the check)")
    found = []
    for side, name in dtypes.items():
        if str(name) not in _DTYPES:
            raise ValueError(f"run.json dtypes: unknown dtype {name!r} for {side}")
        found.append(_DTYPES[str(name)])
    return Precision.BF16 if Precision.BF16 in found else Precision.FP32


def tolerances(precision: Precision | str) -> Tolerances:
    return TOLERANCES[Precision(precision)]


def cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def cuda_device_count() -> int:
    """CUDA GPUs this process sees (0 without torch or CUDA)."""
    if not cuda_available():
        return 0
    import torch

    return torch.cuda.device_count()


def cpu_model() -> str:
    """The CPU's model name (/proc/cpuinfo), else the platform's processor string."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown-cpu"


def cpu_cores() -> int:
    """Cores this process may run on (affinity, so a container's or taskset's limit counts)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def machine_class(profile: Profile | str) -> str:
    """What a throughput number is comparable within: ``gpu: <GPU name> x<count>`` for the GPU profile,
    ``cpu: <CPU model> x<cores>`` for the CPU one. ``RELAX_HARNESS_MACHINE_CLASS`` overrides it."""
    override = os.environ.get("RELAX_HARNESS_MACHINE_CLASS")
    if override:
        return override
    if Profile(profile) is Profile.GPU and cuda_available():
        import torch

        return f"gpu: {torch.cuda.get_device_name(0)} x{torch.cuda.device_count()}"
    return f"cpu: {cpu_model()} x{cpu_cores()}"


def class_slug(machine: str) -> str:
    """A file-name form of a machine class: 'gpu: NVIDIA H100 80GB HBM3 x1' -> 'gpu-nvidia-h100-80gb-hbm3-x1'."""
    return re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-") or "unknown"
