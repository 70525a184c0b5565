"""``--train-memory-margin-bytes``: the device memory a trainer rank must have available when a step starts.

Before each ``train_rollout`` a CUDA trainer rank reads what it can still allocate: the device's free
memory (``torch.cuda.mem_get_info``) plus what its own caching allocator holds unused (reserved minus
allocated). Less than the margin stops the run in one line naming both numbers, instead of an
out-of-memory error somewhere inside the step (a colocated engine that kept its memory, another
process on the GPU). 0 turns the check off; a CPU rank has no device memory to check.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from relax.utils.flag_types import format_size


def available_bytes(device: torch.device) -> int | None:
    """What a rank on ``device`` can still allocate (None on CPU)."""
    if device.type != "cuda":
        return None
    free, _ = torch.cuda.mem_get_info(device)
    return int(free) + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)


class MemoryMarginError(RuntimeError):
    pass


def check_margin(margin: int, device: torch.device, step: int,
                 reading: Callable[[torch.device], int | None] = available_bytes) -> int | None:
    """Raise `MemoryMarginError` when ``device`` has less than ``margin`` bytes available; returns the reading."""
    if not margin:
        return None
    available = reading(device)
    if available is not None and available < margin:
        raise MemoryMarginError(
            f"--train-memory-margin-bytes {format_size(margin)}: only {format_size(available)} of {device} memory "
            f"is available when step {step}'s training starts (free plus this rank's unused cache); free the "
            "device (--offload-rollout, a smaller --sglang-mem-fraction-static) or lower the margin (0: no check)")
    return available
