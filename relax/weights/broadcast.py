"""Weight sync by collective broadcast: engines on other GPUs (or hosts) get each bucket by NCCL.

The object store moves every byte GPU -> host -> (shared memory) -> host -> GPU; an engine on
another GPU of a fully-async run instead joins a process group with the trainer (rank 0), and
each bucket, packed into one flat buffer per dtype (`FlatBucket`), is broadcast device to device:
NCCL when the trainer's weights are on a GPU, gloo when they are on the host (CPU runs, tests).

The group is built from its own TCP store (`WeightGroup`), never the default process group, so
the Megatron trainer's own NCCL world is untouched. Per bucket the driver asks the trainer for
the layout (names, shapes, one (dtype, numel) per buffer), then starts the trainer's send and
every receiver's ``update_weights`` together; a receiver allocates the buffers, takes part in the
broadcast and copies into its model.

`BroadcastGroup` is the driver's record of who is in the group: it (re)builds the group when the
set of broadcast targets changes (first sync, a replaced engine).
"""

from __future__ import annotations

import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import ray
import torch

from relax.backends.embedded.weight_transport import WeightGroup
from relax.weights.cuda_ipc import CudaIpcBucket, FlatBucket, NamedTensors

T = TypeVar("T")


@dataclass(frozen=True)
class BroadcastBucket:
    """The layout of one broadcast bucket; the bytes follow over the group."""

    specs: tuple[tuple[torch.dtype, int], ...]  # (dtype, numel) of each flat buffer, in broadcast order
    entries: tuple[tuple[str, int, tuple[int, ...], int], ...]  # as FlatBucket.entries

    @classmethod
    def of(cls, flat: FlatBucket) -> BroadcastBucket:
        return cls(tuple((b.dtype, b.numel()) for b in flat.buffers), flat.entries)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class WeightSender:
    """Trainer side: rank 0 of the weight group."""

    def __init__(self) -> None:
        self.group: WeightGroup | None = None

    @staticmethod
    def address() -> tuple[str, int]:
        """Where the group's TCP store will listen (this node, a free port)."""
        return ray.util.get_node_ip_address(), _free_port()

    def join(self, address: str, port: int, rank: int, world_size: int, backend: str, group_name: str,
             timeout_s: float) -> None:
        if rank != 0:
            raise ValueError(f"the trainer is rank 0 of the weight group, not {rank}")
        self.close()
        if backend == "nccl":
            torch.cuda.set_device(torch.cuda.current_device())
        self.group = WeightGroup(address, port, 0, world_size, group_name=group_name, backend=backend,
                                 timeout_s=timeout_s)

    def send(self, flat: FlatBucket) -> None:
        if self.group is None:
            raise RuntimeError("weight broadcast: the trainer has not joined a weight group")
        self.group.broadcast(flat.buffers, root=0)

    def close(self) -> None:
        if self.group is not None:
            self.group.close()
            self.group = None


class WeightReceiver:
    """Target side (engine or actor_fwd service actor): turns a sync bucket of any transport into named tensors."""

    def __init__(self, device: torch.device | str) -> None:
        self.device = torch.device(device)
        self.group: WeightGroup | None = None
        self._ipc_mapped: list = []  # the trainer's CUDA IPC buffers, mapped once and kept (cuda_ipc.py)

    def join(self, address: str, port: int, rank: int, world_size: int, backend: str, group_name: str,
             timeout_s: float) -> None:
        if backend == "nccl" and self.device.type != "cuda":
            raise RuntimeError(f"weight broadcast over NCCL needs a CUDA target, this one is on {self.device}")
        if backend == "nccl":
            torch.cuda.set_device(self.device.index if self.device.index is not None else torch.cuda.current_device())
        self.group = WeightGroup(address, port, rank, world_size, group_name=group_name, backend=backend,
                                 timeout_s=timeout_s)

    def receive(self, bucket, apply: Callable[[NamedTensors], T]) -> T:
        """``apply`` the bucket's tensors (copy them into the model), and wait for the copies on the GPU: the
        trainer refills the same IPC buffer with the next bucket as soon as this call returns."""
        result = apply(self.tensors(bucket))
        if isinstance(bucket, CudaIpcBucket | BroadcastBucket) and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        return result

    def tensors(self, bucket) -> NamedTensors:
        """``bucket``: host tensors (object store), a `CudaIpcBucket` or a `BroadcastBucket` (receive now)."""
        if isinstance(bucket, CudaIpcBucket):
            return bucket.open(self._ipc_mapped)
        if isinstance(bucket, BroadcastBucket):
            if self.group is None:
                raise RuntimeError("weight broadcast: this target has not joined a weight group")
            device = self.device if self.group.backend == "nccl" else torch.device("cpu")
            buffers = tuple(torch.empty(n, dtype=dtype, device=device) for dtype, n in bucket.specs)
            self.group.broadcast(buffers, root=0)
            return FlatBucket(buffers, bucket.entries).unpack()
        return list(bucket)


class BroadcastGroup:
    """The driver's view of the weight group: its members, rebuilt when they change."""

    def __init__(self, timeout_s: float = 300.0) -> None:
        self.timeout_s = timeout_s
        self.members: tuple | None = None
        self.backend: str | None = None
        self._generation = 0

    def ensure(self, trainer, targets: list[tuple[int | str, object]], backend: str) -> None:
        """Make ``targets`` (and only they) the receivers of ``trainer``'s broadcasts over ``backend``."""
        members = tuple(target._actor_id.hex() for _, target in targets)
        if members == self.members and backend == self.backend:
            return
        self._generation += 1
        name = f"relax-weights-{self._generation}"
        address, port = ray.get(trainer.weight_group_address.remote())
        world = len(targets) + 1
        ray.get([trainer.join_weight_group.remote(address, port, 0, world, backend, name, self.timeout_s),
                 *(target.join_weight_group.remote(address, port, rank, world, backend, name, self.timeout_s)
                   for rank, (_, target) in enumerate(targets, start=1))], timeout=self.timeout_s + 30)
        self.members, self.backend = members, backend
