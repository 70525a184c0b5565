"""``/update_weights_from_tensor``: the engine copies straight from memory the trainer shares with it.

Sender: every bucket is already packed into the trainer's one persistent uint8 buffer
(`relax.weights.push`); the request carries SGLang's ``flattened_bucket`` item for it, a CUDA IPC
handle when the buffer is on a GPU (the colocate path: trainer and engine on one GPU; an engine of several
GPUs gets ``(name, tensor)`` views of the same buffer, one item per rank, opened on its first GPU), a named
shared-memory segment when it is on the host (same machine). The buffer never moves, so its handle
never changes and an engine maps it once per run. The trainer refills it only after every target
answered, and the receiver answers only after its copies finished (it synchronizes its device), so
no byte is overwritten while an engine still reads it.

Receiver (`TensorReceiver`, in the engine server): the first item of ``serialized_named_tensors``
(this engine has one tensor-parallel rank), decoded by `relax.weights.serialized_tensors`, in any of
SGLang's load formats (``None``/``direct``: ``(name, tensor)`` pairs; ``flattened_bucket``).
"""

from __future__ import annotations

import asyncio
from typing import Any

from relax.weights import serialized_tensors
from relax.weights.transports.base import PackedBucket, Transport


class TensorTransport(Transport):
    name = "tensor"
    endpoint = "/update_weights_from_tensor"

    def stage(self, bucket: PackedBucket) -> None:
        """A host buffer moves into a named shared-memory segment when first shared (torch copies it there and
        swaps the storage's memory); that must happen before the trainer's checksum thread reads the bucket,
        not during it: a CPU run once checksummed half-moved bytes (tests/test_engine_server.py, CI)."""
        serialized_tensors.share_host_buffer(bucket.flat)

    async def send(self, bucket: PackedBucket, version: str) -> None:
        from relax.engine.rollout.engine_client import EngineClient

        items: dict[str | None, str] = {}

        def item(load_format: str | None) -> str:
            if load_format not in items:
                items[load_format] = (
                    serialized_tensors.encode_flattened_bucket(bucket.flat, list(bucket.entries))
                    if load_format else serialized_tensors.encode_named_tensors(
                        serialized_tensors.unflatten(bucket.flat, bucket.entries)))
            return items[load_format]

        await asyncio.gather(*(
            EngineClient(t.url, api_key=t.api_key, weights_timeout=self.timeout_s).update_weights_from_tensor(
                [item(_load_format(t))] * t.tp_size, load_format=_load_format(t), flush_cache=bucket.last,
                weight_version=version if bucket.last else None)
            for t in self.targets))


def _load_format(target) -> str | None:
    """``flattened_bucket`` for a one-rank engine; ``(name, tensor)`` pairs (SGLang's default format) for an engine of
    several ranks, because SGLang moves each such tensor to its rank's own GPU (``_unwrap_tensor``) before loading,
    while a flattened bucket is loaded where it lies: on the first rank's GPU."""
    return "flattened_bucket" if target.tp_size == 1 else None


class TensorReceiver:
    """Engine side: named tensors from an ``/update_weights_from_tensor`` body.

    Keeps the last decoded item alive: while it is held, torch's CUDA IPC cache returns the same mapping
    for the same handle, so a trainer that reuses its buffer is mapped once, not on every bucket.
    """

    def __init__(self) -> None:
        self._held: object = None

    def named_tensors(self, body: dict[str, Any]) -> serialized_tensors.NamedTensors:
        items = body.get("serialized_named_tensors")
        if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
            raise ValueError("serialized_named_tensors must be a non-empty list of base64 strings, one per "
                             "tensor-parallel rank")
        obj = serialized_tensors.decode(items[0])  # this engine's one tensor-parallel rank
        named = serialized_tensors.named_tensors(obj, body.get("load_format"))
        self._held = obj
        return named
