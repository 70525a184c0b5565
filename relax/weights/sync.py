"""Trainer -> engine weight sync with a version number and checksums on both sides.

Weights travel in buckets of at most ``--update-weight-buffer-size`` bytes through Ray's
object store (shared memory on one node). After the last bucket each side reports a
per-tensor checksum keyed by HF name; both go to weights.jsonl, so weight-update equality
is decidable from the artifacts alone.
"""

from __future__ import annotations

import time

import ray

from relax.metrics.artifacts import RunArtifacts


def sync_weights(trainer, engines: list, *, version: int, step: int, bucket_bytes: int, artifacts: RunArtifacts) -> float:
    start = time.perf_counter()
    num_buckets = ray.get(trainer.prepare_sync.remote(bucket_bytes))
    for i in range(num_buckets):
        bucket_ref = trainer.get_bucket.remote(i)
        ray.get([engine.update_weights.remote(bucket_ref, version) for engine in engines])
    trainer_sums = ray.get(trainer.finish_sync.remote())
    engine_sums = ray.get([engine.checksums.remote() for engine in engines])
    elapsed = time.perf_counter() - start
    now = time.time()
    artifacts.weights.write({"version": version, "side": "trainer", "step": step, "time": now, "checksums": trainer_sums})
    for engine_id, sums in enumerate(engine_sums):
        artifacts.weights.write(
            {"version": version, "side": f"engine:{engine_id}", "step": step, "time": now, "checksums": sums}
        )
    artifacts.event("weights_synced", version=version, step=step, buckets=num_buckets, seconds=elapsed)
    return elapsed
