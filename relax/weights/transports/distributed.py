"""``/init_weights_update_group`` + ``/update_weights_from_distributed``: weights by collective broadcast.

For engines on other GPUs or hosts (and every engine of a CPU run, over gloo): the trainer hosts a
weight-update group (rank 0, `relax.weights.update_group`) that each target joins through
``/init_weights_update_group`` at its rank offset. Per bucket the trainer posts the bucket's
``names / dtypes / shapes`` with ``load_format: flattened_bucket`` to every target and, at the same
time, broadcasts the packed uint8 buffer; each target allocates the same layout, receives it and
loads it. One broadcast per bucket whatever its number of tensors. The group is NCCL for GPU weights and
gloo for host weights; ``--checkpoint-engine-backend gloo`` makes it gloo for GPU weights too (`group_backend`:
each bucket is copied to the host and broadcast from there). The group lives as long as the
set of targets does (an NCCL communicator is expensive to build); a changed set gets a new group.

Receiver (`DistributedReceiver`, in the engine server): the groups it joined by name, and the
tensors of one ``/update_weights_from_distributed`` call, in SGLang's two layouts (one flattened
uint8 broadcast, or one broadcast per tensor when ``load_format`` is None).
"""

from __future__ import annotations

import asyncio
import socket
import threading
import uuid
from typing import Any

import torch

from relax.utils.daemon_calls import in_daemon_thread
from relax.weights import serialized_tensors
from relax.weights.devices import cuda_index
from relax.weights.transports.base import PackedBucket, SyncTarget, Transport
from relax.weights.update_group import WeightUpdateGroup, host_store

_DTYPES = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int16, torch.int8,
    torch.uint8, torch.bool)}


def dtype_name(dtype: torch.dtype) -> str:
    """SGLang's dtype string (``getattr(torch, name)`` on the receiving side)."""
    return str(dtype).removeprefix("torch.")


def dtype_from_name(name: str) -> torch.dtype:
    try:
        return _DTYPES[str(name).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"unsupported dtype {name!r}; known: {', '.join(_DTYPES)}") from None


def master_address(targets: list[SyncTarget]) -> str:
    """Where rank 0's store listens: loopback when every target is on this machine's loopback, else this node."""
    from urllib.parse import urlsplit

    if all(urlsplit(t.url).hostname in ("127.0.0.1", "localhost", "::1") for t in targets):
        return "127.0.0.1"
    import ray

    return ray.util.get_node_ip_address() if ray.is_initialized() else socket.gethostbyname(socket.gethostname())


GROUP_BACKENDS = ("nccl", "gloo")  # --checkpoint-engine-backend


def group_backend(requested: str, weights_at: torch.device) -> str:
    """The weight-update group's collective: NCCL for GPU weights unless ``--checkpoint-engine-backend gloo`` asks
    for gloo (each bucket then leaves through the trainer's host memory: where NCCL cannot connect the trainer and
    the engines, or its communicators' memory is not to be spent); gloo for host weights either way."""
    if requested not in GROUP_BACKENDS:
        raise ValueError(f"--checkpoint-engine-backend {requested!r}: one of {', '.join(GROUP_BACKENDS)}")
    return "nccl" if weights_at.type == "cuda" and requested == "nccl" else "gloo"


class DistributedTransport(Transport):
    name = "distributed"
    endpoint = "/update_weights_from_distributed"

    def __init__(self, targets: list[SyncTarget], *, timeout_s: float, group_backend: str = "nccl"):
        super().__init__(targets, timeout_s=timeout_s, group_backend=group_backend)
        self.group: WeightUpdateGroup | None = None
        self.group_name = f"relax-weights-{uuid.uuid4().hex[:12]}"

    def _clients(self) -> list:
        from relax.engine.rollout.engine_client import EngineClient

        return [EngineClient(t.url, api_key=t.api_key, weights_timeout=self.timeout_s) for t in self.targets]

    async def open(self, weights_at: torch.device) -> None:
        """Host the group (rank 0) and have every target join it; the first join refused fails the open at
        once, with that engine's error, instead of leaving the others waiting for it until the timeout."""
        backend = group_backend(self.group_backend, weights_at)
        address = master_address(self.targets)
        world = 1 + sum(t.tp_size for t in self.targets)
        store = host_store(address, world, self.timeout_s)
        port = store.port
        offsets = [1 + sum(t.tp_size for t in self.targets[:i]) for i in range(len(self.targets))]
        # NCCL (and gloo under TORCH_GLOO_LAZY_INIT) builds rank 0's end at once; eager gloo waits in it for
        # every member's connection, so it runs in a thread of its own that a refused join leaves behind
        own = in_daemon_thread(WeightUpdateGroup, address, port, 0, world, group_name=self.group_name,
                               backend=backend, timeout_s=self.timeout_s, store=store, orphaned=_close_group)
        joins = [client.init_weights_update_group(address, port, offset, world, group_name=self.group_name,
                                                  backend=backend)
                 for client, offset in zip(self._clients(), offsets, strict=True)]
        errors = await _errors_of([own, *joins], grace_s=ERROR_GRACE_S)
        if errors:
            if own.done() and not own.cancelled() and own.exception() is None:
                self.group = own.result()  # built: it leaves with the members that joined
            else:
                own.add_done_callback(_close_group)  # if it is ever built
            await self.close()  # bounded by CLOSE_TIMEOUT_S
            raise self._engine_error(errors)
        self.group = own.result()

    def _engine_error(self, errors: list[BaseException]) -> BaseException:
        """The error to raise for a failed open or send: an engine's own (it names the engine) before the
        collective's, and among those an engine that could not be reached (the dead one) before one that
        answered with an error (a survivor told that the sender gave up on the broadcast); a collective
        that failed alone (a peer died mid-broadcast: gloo's "Connection reset by peer", NCCL's abort, a
        rendezvous timeout) as an `EngineError` of the group, so the run's fault tolerance treats it as the
        engine failure it is (health checks then find which engine)."""
        from relax.utils.http_utils import EngineError, EngineHTTPError

        engines = [e for e in errors if isinstance(e, EngineError)]
        unreachable = [e for e in engines if not isinstance(e, EngineHTTPError)]
        if engines:
            return (unreachable or engines)[0]
        first = errors[0]
        if isinstance(first, RuntimeError | TimeoutError | OSError):
            text = (str(first).strip().splitlines() or [""])[0][:300]
            error = EngineError(f"weight update group {self.group_name}", f"{type(first).__name__}: {text}")
            for note in getattr(first, "__notes__", ()):  # --enable-cuda-memory-check's free memory
                error.add_note(note)
            return error
        return first

    async def send(self, bucket: PackedBucket, version: str) -> None:
        if self.group is None:
            raise RuntimeError("distributed weight transport: send before open")
        entries = bucket.entries
        names = [e.name for e in entries]
        dtypes = [dtype_name(e.dtype) for e in entries]
        shapes = [list(e.shape) for e in entries]
        posts = [client.update_weights_from_distributed(
            names, dtypes, shapes, group_name=self.group_name, flush_cache=bucket.last,
            weight_version=version if bucket.last else None, load_format="flattened_bucket")
            for client in self._clients()]
        flat = bucket.flat if self.group.device.type == bucket.flat.device.type else bucket.flat.to(self.group.device)
        errors = await _errors_of([asyncio.to_thread(self.group.broadcast, [flat]), *posts], grace_s=ERROR_GRACE_S)
        if errors:
            raise self._engine_error(errors)

    async def close(self) -> None:
        """Every member leaves at once: the trainer's end and each target's ``/destroy_weights_update_group``
        together. NCCL tears a communicator down collectively (ncclCommDestroy holds an untimed barrier of the
        members on one node), so the trainer's end waiting for its own teardown before asking the targets
        would wait forever; and a target still waiting on a broken group's broadcast is freed by the trainer's
        end going away. A member that never leaves (a dead engine) costs at most `CLOSE_TIMEOUT_S`: the
        trainer's teardown is then left in a daemon thread."""
        group, self.group = self.group, None
        own = [in_daemon_thread(group.close)] if group is not None else []
        destroys = [asyncio.ensure_future(client.destroy_weights_update_group(self.group_name))
                    for client in self._clients()]  # best effort: a target may be the dead one being replaced
        done, pending = await asyncio.wait([*own, *destroys], timeout=CLOSE_TIMEOUT_S)
        for task in pending:
            task.cancel()
        await asyncio.gather(*done, *pending, return_exceptions=True)


CLOSE_TIMEOUT_S = 30.0
"""How long closing a group waits for its members to leave (a dead one never does)."""

ERROR_GRACE_S = 2.0
"""After the first failure of a bucket's send, how long the others get to report their own errors (an
engine's error names the engine, so it is worth the wait) before the send fails."""


def _close_group(group_or_future) -> None:
    """Close a `WeightUpdateGroup` nobody will use (given directly, or as a done future holding one), in a
    daemon thread: an NCCL teardown waits for the other members, and this may be called on the event loop."""
    group = group_or_future
    if isinstance(group_or_future, asyncio.Future):
        if group_or_future.cancelled() or group_or_future.exception() is not None:
            return
        group = group_or_future.result()
    if group is not None:
        threading.Thread(target=group.close, name="relax-weight-group-close", daemon=True).start()


async def _errors_of(calls: list, *, grace_s: float) -> list[BaseException]:
    """Run ``calls`` together; the errors, as soon as one failed (plus ``grace_s`` for the others).

    Waiting for all would wait on the calls a failure leaves stuck: the survivors of a broadcast whose
    sender hit a dead peer never receive, so their requests would hold the push until the weights timeout."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    done, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    if pending and any(t.exception() is not None for t in done):
        more, pending = await asyncio.wait(pending, timeout=grace_s)
        done |= more
        for task in pending:
            task.cancel()  # a thread's broadcast keeps running until the group closes or times out
        await asyncio.gather(*pending, return_exceptions=True)
    return [t.exception() for t in tasks if t in done and t.exception() is not None]


class DistributedReceiver:
    """Engine side: the weight-update groups this server joined, and the tensors of one update."""

    def __init__(self, device: torch.device, timeout_s: float = 300.0) -> None:
        self.device = device
        self.timeout_s = timeout_s
        self.groups: dict[str, WeightUpdateGroup] = {}

    def init(self, body: dict[str, Any]) -> str:
        name = body.get("group_name", "weight_update_group")
        backend = body.get("backend", "nccl")
        if backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"backend 'nccl' needs a CUDA engine; this one is on {self.device.type} (use 'gloo')")
        if backend == "nccl":  # the group's tensors go to the current device: the engine's own
            torch.cuda.set_device(cuda_index(self.device))
        self.destroy(name)
        rank = int(body["rank_offset"])  # + this engine's tensor-parallel rank, which is 0
        self.groups[name] = WeightUpdateGroup(str(body["master_address"]), int(body["master_port"]), rank,
                                              int(body["world_size"]), group_name=name, backend=backend,
                                              timeout_s=self.timeout_s)
        return f"joined {name} as rank {rank} of {body['world_size']} ({backend})"

    def destroy(self, name: str) -> bool:
        """Leave group ``name`` (it blocks while a receive on it is in flight: call it off the event loop)."""
        group = self.groups.pop(name, None)
        if group is not None:
            group.close()
        return group is not None

    def named_tensors(self, body: dict[str, Any]) -> serialized_tensors.NamedTensors:
        name = body.get("group_name", "weight_update_group")
        group = self.groups.get(name)
        if group is None:
            raise RuntimeError(f"no weight update group {name!r}: call /init_weights_update_group first")
        names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
        if not (isinstance(names, list) and isinstance(dtypes, list) and isinstance(shapes, list)
                and len(names) == len(dtypes) == len(shapes)):
            raise ValueError("names, dtypes and shapes must be lists of the same length")
        empty = [(str(n), torch.empty([int(x) for x in s], dtype=dtype_from_name(d), device=group.device))
                 for n, d, s in zip(names, dtypes, shapes, strict=True)]
        load_format = body.get("load_format")
        if load_format is None:
            group.broadcast([t for _, t in empty])
            return empty
        if load_format != "flattened_bucket":
            raise ValueError(f"load_format {load_format!r} is not implemented for update_weights_from_distributed "
                             "(None or flattened_bucket)")
        entries = serialized_tensors.layout(empty)
        flat = torch.empty(entries[-1].end_idx if entries else 0, dtype=torch.uint8, device=group.device)
        group.broadcast([flat])
        return serialized_tensors.unflatten(flat, entries)
