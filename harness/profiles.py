"""Device profiles and the tolerances each one states (DESIGN.md "Profiles")."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


class Profile(StrEnum):
    CPU = "cpu"
    GPU = "gpu"


@dataclass(frozen=True)
class Tolerances:
    parity_rtol: float
    parity_atol: float
    step0_ppo_kl_max: float
    logprob_abs_diff_max: float
    throughput_tolerance: float  # allowed relative regression vs baseline


TOLERANCES: dict[Profile, Tolerances] = {
    # CPU fp32, gloo, deterministic kernels: bitwise or ~1e-6.
    Profile.CPU: Tolerances(parity_rtol=0.0, parity_atol=1e-6, step0_ppo_kl_max=1e-8,
                            logprob_abs_diff_max=1e-4, throughput_tolerance=0.35),
    # GPU bf16 with NCCL reductions: stated looser bounds.
    Profile.GPU: Tolerances(parity_rtol=2e-2, parity_atol=1e-2, step0_ppo_kl_max=1e-8,
                            logprob_abs_diff_max=2e-2, throughput_tolerance=0.10),
}


def tolerances(profile: Profile | str) -> Tolerances:
    return TOLERANCES[Profile(profile)]


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


_KNOWN_GPUS = ("H200", "H100", "A100", "A10G", "L40S", "L4", "B200", "GB200", "V100", "T4", "RTX")


def device_class_name(raw: str) -> str:
    """'NVIDIA H100 80GB HBM3' -> 'H100'; unknown names are slugged."""
    for name in _KNOWN_GPUS:
        if re.search(rf"\b{name}", raw, re.IGNORECASE):
            return name
    return re.sub(r"[^A-Za-z0-9]+", "-", raw).strip("-") or "unknown"


def detect_device_class(profile: Profile | str) -> str:
    """The baseline bucket: 'cpu' for the CPU profile (normalized by calibration), GPU model otherwise."""
    import os

    override = os.environ.get("RELAX_HARNESS_DEVICE_CLASS")
    if override:
        return override
    if Profile(profile) is Profile.CPU or not cuda_available():
        return "cpu"
    import torch

    return device_class_name(torch.cuda.get_device_name(0))
