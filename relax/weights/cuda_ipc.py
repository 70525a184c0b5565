"""Same-GPU weight hand-over through CUDA IPC: the colocate sync without a trip through host memory.

In colocate mode the trainer and the engines are different processes on one GPU. Copying their
weights through Ray's object store means GPU -> host -> shared memory -> host -> GPU for every
byte; here the trainer instead packs a bucket into one flat GPU buffer per dtype and sends only
CUDA IPC handles (a few hundred bytes). The engine maps the trainer's buffer into its own address
space and copies device to device.

The buffer must outlive the engine's copy: the trainer packs every bucket into one persistent
buffer per dtype (as large as the largest bucket) and refills it only when the driver asks for the
next bucket, by which time every target has acknowledged the previous one. Because the buffer
never moves, its IPC handle never changes and each engine maps it once per run (mapping a handle
costs far more than the device-to-device copy). The price is one bucket of extra GPU memory in the
trainer (at most ``--update-weight-buffer-size``). The handle names the GPU by UUID, not by index, because Ray gives each actor its
own ``CUDA_VISIBLE_DEVICES`` and the same GPU can have different indices in the two processes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

NamedTensors = list[tuple[str, torch.Tensor]]

# position of ``storage_device`` in the argument tuple of torch.multiprocessing.reductions.rebuild_cuda_tensor
_STORAGE_DEVICE_ARG = 6


@dataclass(frozen=True)
class FlatBucket:
    """A bucket's tensors copied into one contiguous buffer per dtype.

    ``entries``: ``(name, buffer index, shape, element offset)`` in the bucket's order.
    """

    buffers: tuple[torch.Tensor, ...]
    entries: tuple[tuple[str, int, tuple[int, ...], int], ...]

    @classmethod
    def pack(cls, named: Iterable[tuple[str, torch.Tensor]], pool: dict[torch.dtype, torch.Tensor] | None = None
             ) -> FlatBucket:
        """Copy ``named`` into one buffer per dtype. With ``pool`` the buffers are prefixes of its tensors (grown
        when too small), so consecutive buckets and syncs reuse one allocation and hence one IPC handle."""
        named = [(name, t.detach()) for name, t in named]
        index_of: dict[torch.dtype, int] = {}
        sizes: list[int] = []
        entries = []
        for name, t in named:
            i = index_of.setdefault(t.dtype, len(index_of))
            if i == len(sizes):
                sizes.append(0)
            entries.append((name, i, tuple(t.shape), sizes[i]))
            sizes[i] += t.numel()
        dtypes = sorted(index_of, key=index_of.get)
        device = named[0][1].device if named else torch.device("cpu")
        buffers = tuple(_buffer(pool, d, n, device) for d, n in zip(dtypes, sizes, strict=True))
        if named:  # one multi-tensor copy (a few kernel launches) instead of one launch per tensor
            torch._foreach_copy_([buffers[i][offset:offset + t.numel()].view(t.shape)
                                  for (_, t), (_, i, _, offset) in zip(named, entries, strict=True)],
                                 [t for _, t in named])
        return cls(buffers, tuple(entries))

    def unpack(self) -> NamedTensors:
        """Views into the buffers, one per name (no copy)."""
        out = []
        for name, i, shape, offset in self.entries:
            numel = 1
            for d in shape:
                numel *= d
            out.append((name, self.buffers[i][offset:offset + numel].view(shape)))
        return out

    @property
    def nbytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self.buffers)


def _buffer(pool: dict[torch.dtype, torch.Tensor] | None, dtype: torch.dtype, numel: int,
            device: torch.device) -> torch.Tensor:
    if pool is None:
        return torch.empty(numel, dtype=dtype, device=device)
    held = pool.get(dtype)
    if held is None or held.numel() < numel or held.device != device:
        held = pool[dtype] = torch.empty(numel, dtype=dtype, device=device)
    return held[:numel]


def device_identity(device: torch.device | str) -> str:
    """``"cuda:<GPU UUID>"`` for a CUDA device, else the device type: equal strings = the same physical device."""
    device = torch.device(device)
    if device.type != "cuda":
        return device.type
    index = device.index if device.index is not None else torch.cuda.current_device()
    return f"cuda:{torch.cuda.get_device_properties(index).uuid}"


def _local_index(identity: str) -> int:
    for i in range(torch.cuda.device_count()):
        if device_identity(torch.device("cuda", i)) == identity:
            return i
    raise RuntimeError(f"CUDA IPC weight bucket from GPU {identity.removeprefix('cuda:')}: this process does not "
                       "see that GPU (the trainer and the engine must share it; use --weight-sync-transport "
                       "object-store across GPUs)")


@dataclass(frozen=True)
class CudaIpcBucket:
    """What travels to the engine: the GPU's identity, one IPC handle per flat buffer and the layout."""

    identity: str
    handles: tuple  # (rebuild function, args) per buffer, from torch.multiprocessing.reductions.reduce_tensor
    entries: tuple[tuple[str, int, tuple[int, ...], int], ...]

    @classmethod
    def share(cls, flat: FlatBucket) -> CudaIpcBucket:
        """Handles to ``flat``'s buffers; the caller keeps ``flat`` alive until every receiver has copied."""
        from torch.multiprocessing.reductions import reduce_tensor

        if any(b.device.type != "cuda" for b in flat.buffers):
            raise ValueError("CUDA IPC needs the trainer's weights on a CUDA device")
        torch.cuda.current_stream().synchronize()  # the packing copies are done before anyone reads
        identity = device_identity(flat.buffers[0].device) if flat.buffers else "cuda:none"
        return cls(identity, tuple(reduce_tensor(b) for b in flat.buffers), flat.entries)

    def open(self, keep: list | None = None) -> NamedTensors:
        """Map the trainer's buffers into this process; views by name (valid until the sync finishes).

        ``keep``: a list the caller holds; the mapped buffers replace its contents. While a buffer is held,
        torch's IPC cache returns the same mapping for the same handle, so a trainer that reuses its
        buffers (`FlatBucket.pack` with a pool) is mapped once, not on every bucket of every sync.
        """
        if not self.handles:
            return []
        index = _local_index(self.identity)
        buffers = []
        for rebuild, args in self.handles:
            args = list(args)
            args[_STORAGE_DEVICE_ARG] = index
            buffers.append(rebuild(*args))
        if keep is not None:
            keep[:] = buffers
        return FlatBucket(tuple(buffers), self.entries).unpack()
