"""Colocate offload (``--offload-rollout``, ``--offload-train``): each side gives the memory back while the other runs.

One colocate step, with both on::

    rollout -> engines release -> trainer onload -> train -> trainer offload -> engines resume -> sync

The engines drop their KV cache and their weights (``EmbeddedEngine.release_memory_occupation``, SGLang's
default without ``--enable-weights-cpu-backup``: the values are lost, the sync after the resume writes
every one) after the rollout and resume before the weight sync;
the trainer moves parameters, gradients and optimizer state to the CPU during the rollout
(`relax.backends.torch.offload`). The trainer is parked once before the first rollout. Each move is
an event in events.jsonl (``engine_release``, ``engine_resume``, ``trainer_offload``, ``trainer_onload``
with ``seconds`` and ``device_bytes``) and its time a ``perf/`` metric of the step (docs/artifacts.md).
With ``--update-weights-interval N`` only the steps that end with a sync release and resume the engines
(the others keep their weights, and their memory, through training).
On a CPU device the moves are no-ops that still run and are recorded.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict

import ray
from ray.exceptions import RayActorError

from relax.engine.rollout.engine_client import EngineError

METRIC_KEYS = {
    "engine_release": "release_rollout", "engine_resume": "resume_rollout",
    "trainer_offload": "offload_train", "trainer_onload": "onload_train",
}


class ColocateOffload:
    """The offload half of the colocate loop; every call is a no-op for a side whose flag is off."""

    def __init__(self, rt):
        self.rt = rt
        self.train = bool(rt.args.offload_train)
        self.rollout = bool(rt.args.offload_rollout)
        self._metrics: dict[str, float] = defaultdict(float)

    def park_trainer(self, step: int) -> None:
        """Before the first rollout: the trainer leaves the device to the engines."""
        if self.train:
            self._trainer("trainer_offload", step)

    def before_train(self, step: int) -> None:
        # a step that ends without a sync (--update-weights-interval) keeps the engines' weights: released
        # they would be lost, and only a sync writes them back
        if self.rollout and self.rt.sync_due(step):
            self._engines("engine_release", step)
        if self.train:
            self._trainer("trainer_onload", step)

    def before_sync(self, step: int) -> None:
        if self.train:
            self._trainer("trainer_offload", step)
        if self.rollout and self.rt.sync_due(step):
            self._engines("engine_resume", step)

    def pop_metrics(self) -> dict[str, float]:
        """``perf/<what>_time_s`` and ``perf/<what>_device_bytes`` of the moves since the last call."""
        out, self._metrics = dict(self._metrics), defaultdict(float)
        return out

    # ------------------------------------------------------------------ the moves
    def _trainer(self, event: str, step: int) -> None:
        trainer = self.rt.trainer
        stats = ray.get(trainer.offload.remote() if event == "trainer_offload" else trainer.onload.remote())
        self._record(event, step, stats, role="trainer")

    def _engines(self, event: str, step: int) -> None:
        """SGLang's ``/release_memory_occupation`` / ``/resume_memory_occupation`` on every engine at once; the
        device bytes come from the hosting actors (0 where there is none: an external or SGLang engine)."""
        fleet = self.rt.fleet
        path = "release" if event == "engine_release" else "resume"
        records = fleet.live_records()
        try:
            before = [_device_bytes(r) for r in records]
            clients = [fleet.client(r.index, weights_timeout=self.rt.push_options.timeout_s) for r in records]
            seconds = asyncio.run(_memory_calls(clients, path))
            after = [_device_bytes(r) for r in records]
        except (EngineError, RayActorError) as exc:
            if self.rt.supervisor is None:
                raise fleet.failure(exc) from None
            self.rt.supervisor.check_all()  # a restarted engine holds its memory and current weights
            return self._engines(event, step)
        for record, took, b0, b1 in zip(records, seconds, before, after, strict=True):
            freed = b0 - b1 if path == "release" else b1 - b0
            self._record(event, step, {"seconds": took, "device_bytes": max(freed, 0)}, role=f"engine:{record.index}")

    def _record(self, event: str, step: int, stats: dict[str, float], role: str) -> None:
        self.rt.artifacts.event(event, step=step, role=role, **stats)
        name = METRIC_KEYS[event]
        self._metrics[f"perf/{name}_time_s"] += stats["seconds"]
        self._metrics[f"perf/{name}_device_bytes"] += stats["device_bytes"]


def _device_bytes(record) -> int:
    return int(ray.get(record.actor.device_bytes.remote())) if record.actor is not None else 0


async def _memory_calls(clients: list, path: str) -> list[float]:
    from relax.utils.http_utils import close_session

    async def one(client) -> float:
        start = time.perf_counter()
        await (client.release_memory_occupation() if path == "release" else client.resume_memory_occupation())
        return time.perf_counter() - start

    try:
        return list(await asyncio.gather(*(one(c) for c in clients)))
    finally:
        await close_session()
