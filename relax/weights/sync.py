"""Trainer -> engine weight sync with a version number and checksums on both sides.

Weights travel in buckets of at most ``--update-weight-buffer-size`` bytes, each target by one
of two transports (``--weight-sync-transport``, chosen per target by `choose_transports`):

* ``cuda-ipc``: a target on the same GPU as the trainer's weights (colocate) gets CUDA IPC
  handles to a packed GPU copy of the bucket and copies device to device (relax/weights/cuda_ipc.py);
* ``broadcast``: a target on another GPU joins a process group with the trainer and receives each
  packed bucket by NCCL broadcast (relax/weights/broadcast.py; gloo when forced on the host);
* ``object-store``: host tensors through Ray's object store (shared memory on one node); every
  other target, and every target when the last sync's bytes are kept for restarts.

After the last bucket each side reports a per-tensor checksum keyed by HF name; both go to
weights.jsonl, so weight-update equality is decidable from the artifacts alone. ``targets`` are ``(engine_id, handle)`` pairs: all
engines after a training step, one engine after it was restarted. A target keyed by a string
instead is another holder of the policy (the fully-async ``actor_fwd`` service) and is recorded
under that side name, e.g. ``actor_fwd:0``; it offers the engine's update_weights / checksums.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import ray

from relax.metrics.artifacts import RunArtifacts
from relax.weights.broadcast import BroadcastGroup


@dataclass(frozen=True)
class WeightSnapshot:
    """The buckets and trainer checksums of the last sync, kept with ``--use-fault-tolerance``.

    A restarted engine gets exactly these bytes, never a fresh export: the trainer may be half-way
    through its next optimizer step when an engine dies, and its live weights are then no version
    at all. The bucket refs keep one copy of the weights in Ray's object store (host memory).
    """

    version: int
    buckets: tuple
    trainer_checksums: dict


TRANSPORTS = ("auto", "object-store", "cuda-ipc", "broadcast")


def choose_transports(requested: str, weights_at: str, target_devices: Sequence[str], *,
                      keep_snapshot: bool) -> list[str]:
    """The transport of each target (``weights_at`` / ``target_devices``: `relax.weights.cuda_ipc.device_identity`).

    auto: ``cuda-ipc`` for a target on the GPU that holds the trainer's weights, ``broadcast`` (NCCL)
    for one on another GPU, ``object-store`` otherwise. ``keep_snapshot`` (fault tolerance) needs the
    bytes on the host, so everything goes through the object store then. A forced transport that
    cannot reach some target is an error naming it.
    """
    if requested not in TRANSPORTS:
        raise ValueError(f"unknown weight-sync transport {requested!r}; known: {', '.join(TRANSPORTS)}")
    if requested == "object-store" or keep_snapshot:
        return ["object-store"] * len(target_devices)
    on_gpu = weights_at.startswith("cuda:")
    shared = [on_gpu and device == weights_at for device in target_devices]
    if requested == "cuda-ipc" and not all(shared):
        other = next(device for device, same in zip(target_devices, shared, strict=True) if not same)
        raise RuntimeError(f"--weight-sync-transport cuda-ipc: a sync target is on {other}, but the trainer's "
                           f"weights are on {weights_at}; CUDA IPC needs both on one GPU (use auto or object-store)")
    if requested == "broadcast":
        for device, same in zip(target_devices, shared, strict=True):
            if same or device.startswith("cuda:") != on_gpu:
                raise RuntimeError(f"--weight-sync-transport broadcast: a sync target is on {device} and the "
                                   f"trainer's weights on {weights_at}; NCCL needs them on different GPUs, gloo both "
                                   "on the host (use auto)")
        return ["broadcast"] * len(target_devices)
    return ["cuda-ipc" if same else "broadcast" if on_gpu and device.startswith("cuda:") else "object-store"
            for device, same in zip(target_devices, shared, strict=True)]


def sync_weights(trainer, targets: list[tuple[int | str, object]], *, version: int, step: int, bucket_bytes: int,
                 artifacts: RunArtifacts, timeout: float | None = None, keep_snapshot: bool = False,
                 transport: str = "object-store", group: BroadcastGroup | None = None
                 ) -> tuple[float, WeightSnapshot | None]:
    """Push the trainer's weights to ``targets`` as ``version``; (seconds, snapshot if ``keep_snapshot``).

    ``timeout`` bounds every wait on a target (a hung engine raises GetTimeoutError instead of
    blocking the loop forever); both sides' checksums are taken concurrently. ``transport`` is the
    ``--weight-sync-transport`` request; targets must offer ``device_identity()`` unless it is
    ``object-store``. ``group``: the run's `BroadcastGroup` (rebuilt when its targets change; a new one
    per call when None).
    """
    start = time.perf_counter()
    prepare_ref = trainer.prepare_sync.remote(bucket_bytes)
    if transport == "object-store" or keep_snapshot:
        devices = ["?"] * len(targets)
    else:  # asked while the trainer prepares: one round trip for both
        devices = ray.get([target.device_identity.remote() for _, target in targets], timeout=timeout)
    num_buckets, weights_at, nbytes = ray.get(prepare_ref)
    kinds = choose_transports(transport, weights_at, devices, keep_snapshot=keep_snapshot)
    needed = set(kinds) | ({"object-store"} if keep_snapshot else set())
    if "broadcast" in needed:
        receivers = [t for t, kind in zip(targets, kinds, strict=True) if kind == "broadcast"]
        (group or BroadcastGroup()).ensure(trainer, receivers, "nccl" if weights_at.startswith("cuda:") else "gloo")
    prepared = time.perf_counter()
    buckets, pending, packed = [], [], []
    for i in range(num_buckets):
        ray.get(pending, timeout=timeout)  # every target has the previous bucket: the pool may be refilled
        refs = {kind: trainer.get_bucket.remote(i, kind) for kind in needed}
        sends = [trainer.broadcast_bucket.remote(i)] if "broadcast" in needed else []
        pending = [*(target.update_weights.remote(refs[kind], version)
                     for (_, target), kind in zip(targets, kinds, strict=True)), *sends]
        packed = [*refs.values(), *sends]
        if keep_snapshot:
            buckets.append(refs["object-store"])
    # A target runs its calls in order, so its checksums, asked now, follow its last update without another
    # round trip through the driver. The trainer is done with its buckets once the last one is packed and
    # sent; its checksums then overlap the targets' last copy.
    sums_refs = [target.checksums.remote() for _, target in targets]
    ray.get(packed, timeout=timeout)
    trainer_ref = trainer.finish_sync.remote()
    ray.get(pending, timeout=timeout)
    transferred = time.perf_counter()
    engine_sums = ray.get(sums_refs, timeout=timeout)
    trainer_sums = ray.get(trainer_ref)
    elapsed = time.perf_counter() - start
    phases = {"prepare_s": prepared - start, "transfer_s": transferred - prepared,
              "checksums_s": start + elapsed - transferred}
    _record(artifacts, targets, engine_sums, trainer_sums, version=version, step=step)
    services = {"services": [key for key, _ in targets if isinstance(key, str)]} if any(
        isinstance(key, str) for key, _ in targets) else {}
    artifacts.event("weights_synced", version=version, step=step, buckets=num_buckets, bytes=nbytes, seconds=elapsed,
                    engines=[key for key, _ in targets if not isinstance(key, str)],
                    transports=sorted(set(kinds)), **phases, **services)
    return elapsed, (WeightSnapshot(version, tuple(buckets), trainer_sums) if keep_snapshot else None)


def resync_from_snapshot(snapshot: WeightSnapshot, targets: list[tuple[int | str, object]], *, step: int,
                         artifacts: RunArtifacts, timeout: float | None = None) -> float:
    """Bring (restarted) ``targets`` to the snapshot's version with the snapshot's own bytes."""
    start = time.perf_counter()
    for bucket_ref in snapshot.buckets:
        ray.get([engine.update_weights.remote(bucket_ref, snapshot.version) for _, engine in targets], timeout=timeout)
    engine_sums = ray.get([engine.checksums.remote() for _, engine in targets], timeout=timeout)
    elapsed = time.perf_counter() - start
    _record(artifacts, targets, engine_sums, snapshot.trainer_checksums, version=snapshot.version, step=step)
    artifacts.event("weights_synced", version=snapshot.version, step=step, buckets=len(snapshot.buckets),
                    seconds=elapsed, engines=[key for key, _ in targets if not isinstance(key, str)], resync=True)
    return elapsed


def _record(artifacts: RunArtifacts, targets: list, engine_sums: list, trainer_sums: dict, *, version: int,
            step: int) -> None:
    now = time.time()
    artifacts.weights.write({"version": version, "side": "trainer", "step": step, "time": now, "checksums": trainer_sums})
    for (key, _), sums in zip(targets, engine_sums, strict=True):
        side = key if isinstance(key, str) else f"engine:{key}"
        artifacts.weights.write({"version": version, "side": side, "step": step, "time": now, "checksums": sums})
