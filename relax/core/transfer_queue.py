"""The fully-async loop's data system, after Relax's TransferQueue: storage units plus a controller.

Train samples do not travel through the driver's trainer loop. The rollout producer puts each
step's samples into ``--num-data-storage-units`` `StorageUnit` actors (whole groups, round-robin,
so a group never splits across units) and then publishes the step's metadata, a small
`StoredBatch`. The trainer loop waits for that metadata (``--polling-mode``: polls it every
`POLL_INTERVAL_S`; otherwise blocks on a condition the producer notifies) and hands the
`StoredBatch` to the trainer actor, which fetches the shards from the units itself and
reassembles them in the original order. After the step is trained the driver drops it from
every unit, so a unit holds at most the steps rollout is ahead by (``--max-staleness`` + 1).
"""

from __future__ import annotations

import pickle
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import ray

# How often the trainer loop looks for the next step's metadata in polling mode. A step takes
# seconds, so 20 ms adds at most ~1% latency while costing a lock round-trip 50 times a second.
POLL_INTERVAL_S = 0.02
# In blocking mode the wait still wakes this often to notice a producer thread that died.
_LIVENESS_CHECK_S = 1.0


@ray.remote(num_cpus=0)
class StorageUnit:
    """Holds train samples keyed by (step, shard) until the driver drops the step."""

    def __init__(self) -> None:
        self._shards: dict[int, dict[int, list]] = {}

    def put(self, step: int, shard_index: int, samples: list) -> int:
        self._shards.setdefault(step, {})[shard_index] = samples
        return len(samples)

    def get(self, step: int) -> dict[int, list]:
        if step not in self._shards:
            raise KeyError(f"storage unit holds no shard of step {step} (dropped, or never put)")
        return self._shards[step]

    def drop(self, step: int) -> None:
        self._shards.pop(step, None)

    def stats(self) -> dict[str, int]:
        """What this unit holds now: steps, shards, samples and their pickled bytes (measured here, on demand)."""
        shards = [s for by_index in self._shards.values() for s in by_index.values()]
        return {"steps": len(self._shards), "shards": len(shards), "samples": sum(len(s) for s in shards),
                "bytes": sum(len(pickle.dumps(s, protocol=pickle.HIGHEST_PROTOCOL)) for s in shards)}


@dataclass(frozen=True)
class StoredBatch:
    """A step's metadata: where its samples are. Picklable; `fetch` runs wherever the data is needed.

    ``layout`` has one ``(unit index, group size)`` entry per group in the original order; unit ``u``
    holds its groups concatenated, as shard ``u`` of the step.
    """

    step: int
    units: tuple  # StorageUnit actor handles
    layout: tuple[tuple[int, int], ...]

    @property
    def num_samples(self) -> int:
        return sum(size for _, size in self.layout)

    def fetch(self) -> list:
        """The step's train samples from the storage units, in the order they were put."""
        used = sorted({u for u, _ in self.layout})
        replies = ray.get([self.units[u].get.remote(self.step) for u in used])
        shards = {u: reply[u] for u, reply in zip(used, replies, strict=True)}
        cursor = dict.fromkeys(used, 0)
        samples: list = []
        for u, size in self.layout:
            samples.extend(shards[u][cursor[u]:cursor[u] + size])
            cursor[u] += size
        return samples


class DataQueue:
    """Driver-side controller: owns the storage units and the metadata of complete steps.

    One producer thread calls `put` (or `fail`); the trainer loop calls `wait_meta` then `drop`.
    ``capacity`` bounds the steps stored at once: `put` waits for a `drop` while that many are held
    (the fully-async loop's staleness gating already keeps it below, so this is a safety net).
    """

    def __init__(self, num_units: int, *, polling: bool = True, capacity: int | None = None) -> None:
        if num_units < 1:
            raise ValueError(f"need at least one storage unit, got {num_units}")
        self.units = tuple(StorageUnit.remote() for _ in range(num_units))
        self.polling = polling
        self.capacity = capacity
        self._meta: dict[int, StoredBatch] = {}
        self._stored: set[int] = set()  # steps put (or being put) and not dropped yet
        self._error: BaseException | None = None
        self._closed = False
        self._cond = threading.Condition()

    def put(self, step: int, samples: list, group_sizes: list[int]) -> StoredBatch:
        """Shard ``samples`` (groups of ``group_sizes``, in order) over the units, then publish the step."""
        if sum(group_sizes) != len(samples):
            raise ValueError(f"step {step}: group sizes add up to {sum(group_sizes)}, got {len(samples)} samples")
        with self._cond:
            self._cond.wait_for(lambda: self._closed or self.capacity is None or len(self._stored) < self.capacity)
            if self._closed:
                raise RuntimeError("data queue is closed")
            self._stored.add(step)
        layout = tuple((g % len(self.units), size) for g, size in enumerate(group_sizes))
        shards: dict[int, list] = {}
        start = 0
        for u, size in layout:
            shards.setdefault(u, []).extend(samples[start:start + size])
            start += size
        ray.get([self.units[u].put.remote(step, u, shard) for u, shard in shards.items()])
        batch = StoredBatch(step, self.units, layout)
        with self._cond:
            self._meta[step] = batch
            self._cond.notify_all()
        return batch

    def fail(self, exc: BaseException) -> None:
        """The producer failed: `wait_meta` raises ``exc`` for every step not published before."""
        with self._cond:
            self._error = exc
            self._cond.notify_all()

    def wait_meta(self, step: int, alive: Callable[[], bool] = lambda: True) -> StoredBatch:
        """Return once ``step``'s metadata is published; raise the producer's error, or if it died.

        ``alive`` reports whether the producer still runs, so a producer that ends without
        publishing the step makes the trainer loop raise instead of hang.
        """
        while True:
            running = alive()  # sampled before the checks: a producer seen dead has written all it will
            with self._cond:
                if step in self._meta:
                    return self._meta[step]
                if self._error is not None:
                    raise self._error
                if self._closed:
                    raise RuntimeError("data queue is closed")
                if not running:
                    raise RuntimeError(f"rollout producer stopped without producing step {step}")
                if not self.polling:
                    self._cond.wait(_LIVENESS_CHECK_S)  # woken by put / fail / close
                    continue
            time.sleep(POLL_INTERVAL_S)

    def drop(self, step: int) -> None:
        """Free ``step`` on every unit (after it was trained)."""
        ray.get([unit.drop.remote(step) for unit in self.units])
        with self._cond:
            self._meta.pop(step, None)
            self._stored.discard(step)
            self._cond.notify_all()

    def stats(self) -> list[dict[str, int]]:
        return ray.get([unit.stats.remote() for unit in self.units])

    def close(self) -> None:
        """Kill the units; a `put` or `wait_meta` still running raises instead of hanging."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        for unit in self.units:
            try:
                ray.kill(unit, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
