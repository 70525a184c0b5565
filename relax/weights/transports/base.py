"""What every weight-sync transport shares: the targets, the bucket in flight, the transport interface.

A transport owns both ends of one way SGLang's HTTP API moves weights: the sender runs in the
trainer (rank 0) and turns a packed bucket into requests to every target; the receiver runs in an
engine server and turns such a request into named tensors for the model. Which transport reaches
which target is decided per sync (`relax.weights.transports.choose`).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Literal

import torch

from relax.weights.serialized_tensors import TensorEntry


@dataclass(frozen=True)
class SyncTarget:
    """One holder of the policy's weights, reached over SGLang's HTTP API (picklable: it travels to the trainer).

    ``device``: where its weights live, as `relax.weights.device_identity` names devices (``cuda:<GPU uuid>@<host>``,
    ``cpu:<host>``), or ``unknown`` (an external server that does not say). ``checksums``: what its
    ``/weights_checker {"action": "checksum"}`` answer holds: ``relax`` (the embedded engine: relax's
    checksums of HF-named tensors), ``sglang`` (a stock SGLang server: SGLang's hashes of its own parameters,
    `relax.weights.sglang_checksums`), or None (nothing to compare). ``tp_size``: its tensor-parallel ranks
    (one ``serialized_named_tensors`` item each). ``host_tensors``: its ``/update_weights_from_tensor`` maps a
    host buffer shared by name and copies it to its own device, a GPU included (relax's engine; a stock SGLang
    server's unpickler is not known to admit torch's by-name storage, so it is not asked to). ``kv_heads``: its
    model's key/value head count, which the trainer needs to hash a tensor-parallel engine's shards (None: unknown).
    """

    side: str  # its name in weights.jsonl: engine:<i>, actor_fwd:0
    url: str
    device: str = "unknown"
    checksums: Literal["relax", "sglang"] | None = "relax"
    tp_size: int = 1
    api_key: str | None = None
    host_tensors: bool = False
    kv_heads: int | None = None  # its model's key/value heads: how its tensor-parallel ranks split k and v


@dataclass(frozen=True)
class PackedBucket:
    """One bucket packed back to back into a uint8 buffer (SGLang's flattened-bucket layout)."""

    flat: torch.Tensor
    entries: tuple[TensorEntry, ...]
    last: bool  # the sync's last bucket: the version flips and caches flush with it

    @property
    def nbytes(self) -> int:
        return self.flat.numel()


class Transport(ABC):
    """The sender half: open once per set of targets, send every bucket, close when the set changes."""

    name: ClassVar[str]
    endpoint: ClassVar[str]  # the SGLang endpoint that carries the bytes

    def __init__(self, targets: list[SyncTarget], *, timeout_s: float, group_backend: str = "nccl"):
        """``group_backend`` (``--checkpoint-engine-backend``): a broadcasting transport's collective for GPU
        weights, ``nccl`` or ``gloo`` (host weights always go over gloo)."""
        self.targets = list(targets)
        self.timeout_s = timeout_s
        self.group_backend = group_backend

    async def open(self, weights_at: torch.device) -> None:  # noqa: B027 - most transports need no set-up
        """Set-up before the first bucket (e.g. the weight-update group)."""

    def stage(self, bucket: PackedBucket) -> None:  # noqa: B027 - most transports send the buffer as it is
        """Make ``bucket``'s buffer sendable before the trainer's checksum thread starts reading it."""

    @abstractmethod
    async def send(self, bucket: PackedBucket, version: str) -> None:
        """Deliver ``bucket`` to every target; returns once each has copied it (the buffer may be refilled)."""

    async def close(self) -> None:  # noqa: B027
        """Tear down what `open` built."""
