"""Names for where tensors live, comparable across processes: the key of the transport choice.

``cuda:<GPU UUID>@<host name>`` for a GPU (its UUID, not its index: Ray gives each actor its own
``CUDA_VISIBLE_DEVICES``, so one GPU can have different indices in two processes) and ``cpu:<host name>`` for
host memory (two processes on one machine can share named shared-memory segments, whatever device the reader
copies them to: `host_of`).
"""

from __future__ import annotations

import socket

import torch


def cuda_index(device: torch.device | str) -> int:
    """The index of a CUDA device; a bare ``cuda`` means this process's current device (what tensors placed
    on it use). ``torch.cuda.set_device`` and friends refuse a device without an index."""
    device = torch.device(device)
    if device.type != "cuda":
        raise ValueError(f"{device} is not a CUDA device")
    return device.index if device.index is not None else torch.cuda.current_device()


def device_identity(device: torch.device | str) -> str:
    device = torch.device(device)
    if device.type != "cuda":
        return f"{device.type}:{socket.gethostname()}"
    return f"cuda:{torch.cuda.get_device_properties(cuda_index(device)).uuid}@{socket.gethostname()}"


def host_of(identity: str) -> str | None:
    """The host an identity's memory is on (``cpu:H`` and ``cuda:U@H`` give H), None when it does not say."""
    if identity.startswith("cpu:"):
        return identity[len("cpu:"):]
    if identity.startswith("cuda:") and "@" in identity:
        return identity.rsplit("@", 1)[1]
    return None
