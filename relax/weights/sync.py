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

import ray

from relax.metrics.artifacts import RunArtifacts


def sync_weights(trainer, targets: list[tuple[int, object]], *, version: int, step: int, bucket_bytes: int,
                 artifacts: RunArtifacts) -> float:
    start = time.perf_counter()
    num_buckets = ray.get(trainer.prepare_sync.remote(bucket_bytes))
    for i in range(num_buckets):
        bucket_ref = trainer.get_bucket.remote(i)
        ray.get([engine.update_weights.remote(bucket_ref, version) for _, engine in targets])
    trainer_sums = ray.get(trainer.finish_sync.remote())
    engine_sums = ray.get([engine.checksums.remote() for _, engine in targets])
    elapsed = time.perf_counter() - start
    now = time.time()
    artifacts.weights.write({"version": version, "side": "trainer", "step": step, "time": now, "checksums": trainer_sums})
    for (key, _), sums in zip(targets, engine_sums, strict=True):
        side = key if isinstance(key, str) else f"engine:{key}"
        artifacts.weights.write({"version": version, "side": side, "step": step, "time": now, "checksums": sums})
    services = {"services": [key for key, _ in targets if isinstance(key, str)]} if any(
        isinstance(key, str) for key, _ in targets) else {}
    artifacts.event("weights_synced", version=version, step=step, buckets=num_buckets, seconds=elapsed,
                    engines=[key for key, _ in targets if not isinstance(key, str)], **services)
    return elapsed
