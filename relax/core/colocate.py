"""The colocate training loop: rollout -> train -> sync weights, one step at a time.

It reads top to bottom in the order a run happens; every phase is a named component.
"""

from __future__ import annotations

import time

from relax.core.fully_async import fill_weight_versions
from relax.core.offload import ColocateOffload
from relax.core.runtime import Runtime, rollout_metrics
from relax.core.train_data import to_train_samples


def train_colocate(rt: Runtime) -> None:
    args, run, artifacts = rt.args, rt.run, rt.artifacts
    offload = ColocateOffload(rt)  # --offload-rollout / --offload-train; no-ops when off
    offload.park_trainer(rt.start_step)
    for step in range(rt.start_step, run.num_rollout):
        t0 = time.perf_counter()
        artifacts.event("step_start", step=step)
        eval_metrics = rt.evaluate(step)
        artifacts.event("phase", step=step, phase="rollout")
        with rt.engine_profile(step):  # --sglang-profile
            groups = run.rollout_fn(args, step, run.data_source)
        fill_weight_versions(groups, rt.held_version(step))  # a custom generate function may set none
        samples, raw_rewards = to_train_samples(args, groups)
        t1 = time.perf_counter()
        offload.before_train(step)
        artifacts.event("phase", step=step, phase="train")
        train_metrics = rt.train_rollout(samples, step)
        t2 = time.perf_counter()
        offload.before_sync(step)
        artifacts.event("phase", step=step, phase="sync")
        sync_s = rt.sync(version=step + 1, step=step) if rt.sync_due(step) else 0.0  # --update-weights-interval
        step_s = time.perf_counter() - t0
        perf = {"perf/rollout_time_s": t1 - t0, "perf/train_time_s": t2 - t1, "perf/sync_time_s": sync_s,
                "perf/step_time_s": step_s, **offload.pop_metrics(),
                "perf/tokens_per_s": sum(len(s.tokens) for s in samples) / max(step_s, 1e-9)}
        rt.finish_step(step, groups, rollout_metrics(groups, raw_rewards, t1 - t0, step),
                       {**train_metrics, **eval_metrics}, perf, weight_version=rt.held_version(step))
