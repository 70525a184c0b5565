"""Colocate offload (``--offload-rollout``, ``--offload-train``): each side gives the memory back while the other runs.

One colocate step, with both on::

    rollout -> engines release -> trainer onload -> train -> trainer offload -> engines resume -> sync

The engines drop their KV cache and park their weights in pinned CPU memory
(``EmbeddedEngine.release_memory_occupation``) after the rollout and resume before the weight sync;
the trainer moves parameters, gradients and optimizer state to the CPU during the rollout
(`relax.backends.torch.offload`). The trainer is parked once before the first rollout. Each move is
an event in events.jsonl (``engine_release``, ``engine_resume``, ``trainer_offload``, ``trainer_onload``
with ``seconds`` and ``device_bytes``) and its time a ``perf/`` metric of the step (docs/artifacts.md).
On a CPU device the moves are no-ops that still run and are recorded.
"""

from __future__ import annotations

from collections import defaultdict

import ray
from ray.exceptions import RayActorError

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
        if self.rollout:
            self._engines("engine_release", step)
        if self.train:
            self._trainer("trainer_onload", step)

    def before_sync(self, step: int) -> None:
        if self.train:
            self._trainer("trainer_offload", step)
        if self.rollout:
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
        method = "release_memory_occupation" if event == "engine_release" else "resume_memory_occupation"
        engines = list(enumerate(self.rt.engines))
        try:
            results = ray.get([getattr(engine, method).remote() for _, engine in engines])
        except RayActorError:
            if self.rt.supervisor is None:
                raise
            self.rt.supervisor.check_all()  # a restarted engine holds its memory and current weights
            return self._engines(event, step)
        for (index, _), stats in zip(engines, results, strict=True):
            self._record(event, step, stats, role=f"engine:{index}")

    def _record(self, event: str, step: int, stats: dict[str, float], role: str) -> None:
        self.rt.artifacts.event(event, step=step, role=role, **stats)
        name = METRIC_KEYS[event]
        self._metrics[f"perf/{name}_time_s"] += stats["seconds"]
        self._metrics[f"perf/{name}_device_bytes"] += stats["device_bytes"]
