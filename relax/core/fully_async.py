"""The fully-async loop: rollout runs ahead of training by at most ``--max-staleness`` versions.

A producer thread generates the batch for step k as soon as the engines hold weights of
version >= k - max_staleness (with ``--update-weights-interval N``: the version the last sync due by
step k - max_staleness gave, so staleness reaches max_staleness + N - 1), and puts its train samples into the storage units of the data
queue (transfer_queue.py); the trainer loop waits for the step's metadata, has the trainer
actor fetch the samples from the units and train, drops the step, pushes version k+1 to the
engines (between two rollouts, never inside one: see below) and moves on. The driver keeps only
the rollout groups (metrics, sample accounting). With ``--max-staleness 0`` the schedule, and therefore every number, equals the
colocate loop.

The data position saved in a checkpoint is the one right after the trained step's prompts
were drawn, so batches generated ahead but not trained are regenerated after a resume,
never lost.

Weight syncs reach the engines over HTTP while the producer may be generating; the runtime's
``generation_lock`` makes a sync wait for the rollout in flight, so it lands between two rollouts
and every request's tokens come from one weight version.

Staleness accounting needs each sample's ``weight_version``. The default rollout copies it from
the engine's reply; a custom generate function may not set it (seed 001's example does not).
Such a sample gets the version the engines held when its step's rollout started, recorded here
before the rollout function is called: a lower bound (a sync may land during the rollout), so
``rollout/staleness_max`` never understates; ``rollout/unversioned_samples`` counts them.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from relax.core.runtime import Runtime, fill_weight_versions, rollout_metrics
from relax.core.train_data import to_train_samples
from relax.core.transfer_queue import DataQueue
from relax.engine.rollout.sglang_rollout import GenerateState


@dataclass
class _Rollout:
    """What the driver keeps of a step's rollout; its train samples live in the data queue."""

    groups: list
    raw_rewards: list
    seconds: float
    num_tokens: int


class _Producer(threading.Thread):
    def __init__(self, rt: Runtime, data: DataQueue):
        super().__init__(name="relax-rollout", daemon=True)
        self.rt = rt
        self.data = data
        self.rollouts: dict[int, _Rollout] = {}  # under data_lock; written before the step is published
        self.version = rt.start_step
        self.cond = threading.Condition()
        self.data_lock = threading.Lock()
        self.data_states: dict[int, dict] = {}
        self.stopped = False

    def advance(self, trained: int, version: int) -> None:
        """Steps before ``trained`` are trained; the engines hold ``version`` (older with --update-weights-interval)."""
        with self.data_lock:  # positions before `trained` can no longer be checkpointed
            for step in [k for k in self.data_states if k < trained]:
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

    def queued(self) -> int:
        with self.data_lock:
            return len(self.rollouts)

    def take(self, step: int) -> _Rollout:
        with self.data_lock:
            return self.rollouts.pop(step)

    def run(self) -> None:
        rt, args = self.rt, self.rt.args
        try:
            for step in range(rt.start_step, rt.run.num_rollout):
                with self.cond:
                    # the version a sync schedule with no lag would have given step - k (just step - k at
                    # --update-weights-interval 1)
                    needed = rt.held_version(step - args.max_staleness)
                    self.cond.wait_for(lambda n=needed: self.stopped or self.version >= n)
                    if self.stopped:
                        return
                    started = self.version  # what the engines hold as this rollout starts
                with self.data_lock:
                    self.data_states[step] = rt.run.data_source.state_dict()
                rt.artifacts.event("phase", step=step, phase="rollout")
                t0 = time.perf_counter()
                with rt.generation_lock, rt.engine_profile(step):  # a weight sync waits for this rollout (runtime.py)
                    groups = rt.run.rollout_fn(args, step, rt.run.data_source)
                unversioned = fill_weight_versions(groups, started)
                GenerateState(args).add_metrics(step, {"rollout/start_version": float(started),
                                                       **({"rollout/unversioned_samples": float(unversioned)}
                                                          if unversioned else {})})
                samples, raw = to_train_samples(args, groups)
                seconds = time.perf_counter() - t0
                with self.data_lock:
                    self.rollouts[step] = _Rollout(groups, raw, seconds, sum(len(s.tokens) for s in samples))
                self.data.put(step, samples, [len(g) for g in groups])
        except BaseException as exc:  # noqa: BLE001 - handed to the trainer loop, which re-raises
            self.data.fail(exc)


def train_fully_async(rt: Runtime) -> None:
    run, artifacts, args = rt.run, rt.artifacts, rt.args
    data = DataQueue(args.num_data_storage_units, polling=args.polling_mode, capacity=args.max_staleness + 1)
    producer = _Producer(rt, data)
    producer.start()
    try:
        for step in range(rt.start_step, run.num_rollout):
            t0 = time.perf_counter()
            queued = producer.queued()  # batches generated ahead, waiting (0: this step waits for its rollout)
            stored = data.wait_meta(step, alive=producer.is_alive)
            rollout = producer.take(step)
            wait_s = time.perf_counter() - t0
            artifacts.event("step_start", step=step)
            eval_metrics = rt.evaluate(step)  # engines hold version `step` here: syncs happen only in this thread
            t1 = time.perf_counter()
            artifacts.event("phase", step=step, phase="train")
            train_metrics = rt.train_rollout(stored, step)  # the trainer actor fetches the samples from the units
            data.drop(step)
            t2 = time.perf_counter()
            artifacts.event("phase", step=step, phase="sync")
            sync_s = rt.sync(version=step + 1, step=step) if rt.sync_due(step) else 0.0  # --update-weights-interval
            producer.advance(step + 1, rt.held_version(step + 1))
            step_s = time.perf_counter() - t0
            perf = {"perf/rollout_time_s": rollout.seconds, "perf/rollout_wait_s": wait_s,
                    "perf/train_time_s": t2 - t1, "perf/sync_time_s": sync_s, "perf/step_time_s": step_s,
                    "perf/tokens_per_s": rollout.num_tokens / max(step_s, 1e-9), "perf/queue_depth": float(queued)}
            versions = [s.weight_version for g in rollout.groups for s in g]
            rt.finish_step(step, rollout.groups, rollout_metrics(rollout.groups, rollout.raw_rewards, rollout.seconds,
                                                                 step),
                           {**train_metrics, **eval_metrics}, perf, weight_version=min(versions),
                           data_state=lambda s=step: producer.data_state_after(s))
    finally:
        producer.stop()
        data.close()
