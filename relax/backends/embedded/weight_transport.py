"""How weights travel to an engine server: HTTP payloads and a broadcast process group.

``/update_weights_from_tensor`` takes one of two payloads (both carry HF names):

* ``{"serialized_named_tensors": [b64, ...]}`` - each item is base64 of ``torch.save`` of a
  ``list[(name, tensor)]`` (loaded with ``weights_only=True``, so no arbitrary pickle). It works
  across hosts; one item per bucket.
* ``{"load_format": "shm", "path": "/dev/shm/....safetensors"}`` - same-host zero-copy: the sender
  writes a safetensors file into shared memory (``/dev/shm``), the engine memory-maps it, and the
  sender deletes it after the call. This is the colocate CPU path.

``/update_weights_from_distributed`` receives tensors by broadcast from rank 0 (the trainer)
over a process group made by `init_weight_group`. The group is built directly from a TCP store
(``ProcessGroupGloo`` on CPU, ``ProcessGroupNCCL`` on GPU), never the default process group, so
a trainer that already runs DDP can own one too.
"""

from __future__ import annotations

import base64
import io
import os
import tempfile
import uuid
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

import torch

NamedTensors = list[tuple[str, torch.Tensor]]

_DTYPES = {str(d).removeprefix("torch."): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                                       torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool)}


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[name.removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; known: {', '.join(_DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# ---------------------------------------------------------------------- serialized payload
def encode_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> str:
    buf = io.BytesIO()
    torch.save([(name, t.detach().cpu().contiguous()) for name, t in named], buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def decode_named_tensors(item: str) -> NamedTensors:
    try:
        raw = base64.b64decode(item, validate=True)
        named = torch.load(io.BytesIO(raw), weights_only=True)
    except Exception as exc:
        raise ValueError(f"serialized_named_tensors item is not a base64 torch.save payload: {exc}") from None
    if not isinstance(named, list) or not all(
        isinstance(x, (tuple, list)) and len(x) == 2 and isinstance(x[0], str) and isinstance(x[1], torch.Tensor)
        for x in named
    ):
        raise ValueError("serialized_named_tensors item must hold a list of (name, tensor) pairs")
    return [(name, t) for name, t in named]


# ---------------------------------------------------------------------- shared-memory payload
def shm_dir() -> Path:
    return Path("/dev/shm") if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
        else Path(tempfile.gettempdir())


def write_shm(named: Iterable[tuple[str, torch.Tensor]]) -> Path:
    """Write tensors to a safetensors file in shared memory; the caller deletes it when done."""
    from safetensors.torch import save_file

    path = shm_dir() / f"relax-weights-{uuid.uuid4().hex}.safetensors"
    tensors, seen = {}, set()
    for name, t in named:  # safetensors refuses shared storage (tied weights): copy repeats
        t = t.detach().cpu().contiguous()
        key = (t.untyped_storage().data_ptr(), t.storage_offset())
        tensors[name] = t.clone() if key in seen else t
        seen.add(key)
    save_file(tensors, str(path))
    return path


def read_safetensors(path: str | os.PathLike) -> NamedTensors:
    from safetensors import safe_open

    if not Path(path).is_file():
        raise ValueError(f"no weights file at {path}")
    with safe_open(str(path), framework="pt") as f:
        return [(name, f.get_tensor(name)) for name in f.keys()]


def read_hf_dir(model_path: str | os.PathLike) -> NamedTensors:
    """Every tensor of the ``*.safetensors`` files in an HF checkpoint directory."""
    files = sorted(Path(model_path).glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {model_path}")
    return [item for f in files for item in read_safetensors(f)]


# ---------------------------------------------------------------------- broadcast group
class WeightGroup:
    """A process group for weight broadcast, built from its own TCP store (rank 0 hosts it)."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, *,
                 group_name: str = "weight_update_group", backend: str = "gloo", timeout_s: float = 300.0):
        import torch.distributed as dist

        if backend not in ("gloo", "nccl"):
            raise ValueError(f"unsupported weight-update backend {backend!r} (gloo or nccl)")
        timeout = timedelta(seconds=timeout_s)
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        self._store = dist.TCPStore(master_address, int(master_port), world_size, is_master=rank == 0,
                                    timeout=timeout, wait_for_workers=False)
        prefixed = dist.PrefixStore(group_name, self._store)
        if backend == "gloo":
            self.pg = dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)
        else:
            self.pg = dist.ProcessGroupNCCL(prefixed, rank, world_size)

    def broadcast(self, tensors: Iterable[torch.Tensor], root: int = 0) -> None:
        """Broadcast each tensor from ``root`` in order (sender and receivers call this alike)."""
        for t in tensors:
            self.pg.broadcast(t, root).wait()

    def close(self) -> None:
        self.pg = None
        self._store = None
