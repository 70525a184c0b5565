"""The fully-async loop: rollout runs ahead of training by at most ``--max-staleness`` versions.

A producer thread generates the batch for step k as soon as the engines hold weights of
version >= k - max_staleness, and hands it to the trainer through a bounded queue; the
trainer trains, pushes version k+1 to the engines (Ray runs each engine's calls in order,
so a sync lands between two generate calls, never inside one) and moves on. With
``--max-staleness 0`` the schedule, and therefore every number, equals the colocate loop.

The data position saved in a checkpoint is the one right after the trained step's prompts
were drawn, so batches generated ahead but not trained are regenerated after a resume,
never lost.
"""

from __future__ import annotations

import queue
import threading
import time
from dataclasses import dataclass

from relax.core.runtime import Runtime, rollout_metrics
from relax.core.train_data import to_train_samples


@dataclass
class _Batch:
    step: int
    groups: list
    samples: list
    raw_rewards: list
    seconds: float


class _Producer(threading.Thread):
    def __init__(self, rt: Runtime):
        super().__init__(name="relax-rollout", daemon=True)
        self.rt = rt
        self.queue: queue.Queue = queue.Queue(maxsize=rt.args.max_staleness + 1)
        self.version = rt.start_step
        self.cond = threading.Condition()
        self.data_lock = threading.Lock()
        self.data_states: dict[int, dict] = {}
        self.stopped = False

    def advance(self, version: int) -> None:
        with self.data_lock:  # positions before `version` can no longer be checkpointed
            for step in [k for k in self.data_states if k < version]:
                del self.data_states[step]
        with self.cond:
            self.version = version
            self.cond.notify_all()

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()

    def data_state_after(self, step: int) -> dict:
        with self.data_lock:
            return self.data_states.get(step + 1) or self.rt.run.data_source.state_dict()

    def run(self) -> None:
        rt, args = self.rt, self.rt.args
        try:
            for step in range(rt.start_step, rt.run.num_rollout):
                with self.cond:
                    self.cond.wait_for(lambda s=step: self.stopped or self.version >= s - args.max_staleness)
                    if self.stopped:
                        return
                with self.data_lock:
                    self.data_states[step] = rt.run.data_source.state_dict()
                rt.artifacts.event("phase", step=step, phase="rollout")
                t0 = time.perf_counter()
                groups = rt.run.rollout_fn(args, step, rt.run.data_source)
                samples, raw = to_train_samples(args, groups)
                self.queue.put(_Batch(step, groups, samples, raw, time.perf_counter() - t0))
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer loop, which re-raises
            self.queue.put(exc)


def _next_batch(producer: _Producer) -> _Batch:
    while True:
        try:
            item = producer.queue.get(timeout=1.0)
        except queue.Empty:
            if not producer.is_alive():
                raise RuntimeError("rollout producer stopped without producing a batch") from None
            continue
        if isinstance(item, BaseException):
            raise item
        return item


def train_fully_async(rt: Runtime) -> None:
    run, artifacts = rt.run, rt.artifacts
    producer = _Producer(rt)
    producer.start()
    try:
        for step in range(rt.start_step, run.num_rollout):
            t0 = time.perf_counter()
            batch = _next_batch(producer)
            assert batch.step == step, (batch.step, step)
            artifacts.event("step_start", step=step)
            eval_metrics = rt.evaluate(step)  # engines hold version `step` here: syncs happen only in this thread
            t1 = time.perf_counter()
            artifacts.event("phase", step=step, phase="train")
            train_metrics = rt.train_rollout(batch.samples, step)
            t2 = time.perf_counter()
            artifacts.event("phase", step=step, phase="sync")
            sync_s = rt.sync(version=step + 1, step=step)
            producer.advance(step + 1)
            step_s = time.perf_counter() - t0
            perf = {"perf/rollout_time_s": batch.seconds, "perf/rollout_wait_s": t1 - t0, "perf/train_time_s": t2 - t1,
                    "perf/sync_time_s": sync_s, "perf/step_time_s": step_s,
                    "perf/tokens_per_s": sum(len(s.tokens) for s in batch.samples) / max(step_s, 1e-9)}
            versions = [s.weight_version for g in batch.groups for s in g]
            rt.finish_step(step, batch.groups, rollout_metrics(batch.groups, batch.raw_rewards, batch.seconds, step),
                           {**train_metrics, **eval_metrics}, perf, weight_version=min(versions),
                           data_state=lambda s=step: producer.data_state_after(s))
    finally:
        producer.stop()
