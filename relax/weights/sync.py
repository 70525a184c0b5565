"""Trainer -> engine weight sync with a version number and checksums on both sides.

Weights travel in buckets of at most ``--update-weight-buffer-size`` bytes through Ray's
object store (shared memory on one node). After the last bucket each side reports a
per-tensor checksum keyed by HF name; both go to weights.jsonl, so weight-update equality
is decidable from the artifacts alone. ``targets`` are ``(engine_id, handle)`` pairs: all
engines after a training step, one engine after it was restarted. A target keyed by a string
instead is another holder of the policy (the fully-async ``actor_fwd`` service) and is recorded
under that side name, e.g. ``actor_fwd:0``; it offers the engine's update_weights / checksums.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import ray

from relax.metrics.artifacts import RunArtifacts


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


def sync_weights(trainer, targets: list[tuple[int | str, object]], *, version: int, step: int, bucket_bytes: int,
                 artifacts: RunArtifacts, timeout: float | None = None,
                 keep_snapshot: bool = False) -> tuple[float, WeightSnapshot | None]:
    """Push the trainer's weights to ``targets`` as ``version``; (seconds, snapshot if ``keep_snapshot``).

    ``timeout`` bounds every wait on a target (a hung engine raises GetTimeoutError instead of
    blocking the loop forever); both sides' checksums are taken concurrently.
    """
    start = time.perf_counter()
    num_buckets = ray.get(trainer.prepare_sync.remote(bucket_bytes))
    buckets = []
    for i in range(num_buckets):
        bucket_ref = trainer.get_bucket.remote(i)
        ray.get([engine.update_weights.remote(bucket_ref, version) for _, engine in targets], timeout=timeout)
        if keep_snapshot:
            buckets.append(bucket_ref)
    trainer_ref = trainer.finish_sync.remote()
    engine_sums = ray.get([engine.checksums.remote() for _, engine in targets], timeout=timeout)
    trainer_sums = ray.get(trainer_ref)
    elapsed = time.perf_counter() - start
    _record(artifacts, targets, engine_sums, trainer_sums, version=version, step=step)
    services = {"services": [key for key, _ in targets if isinstance(key, str)]} if any(
        isinstance(key, str) for key, _ in targets) else {}
    artifacts.event("weights_synced", version=version, step=step, buckets=num_buckets, seconds=elapsed,
                    engines=[key for key, _ in targets if not isinstance(key, str)], **services)
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
