"""The number of streaming multiprocessors the decode kernels size their grids by (one query per device)."""

from __future__ import annotations

import functools

import torch

DEFAULT_SMS = 132  # an H100's, for CPU tensors (the kernels' interpreted tests)


@functools.cache
def sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else DEFAULT_SMS
