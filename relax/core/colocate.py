"""The colocate training loop: rollout -> train -> sync weights, one step at a time.

It reads top to bottom in the order a run happens; every phase is a named component.
"""

from __future__ import annotations

import time
from argparse import Namespace

import ray

from relax import checkpoint as ckpt
from relax.core.train_data import to_train_samples
from relax.core.setup import RunInputs
from relax.distributed.actors import EngineActor, TrainerActor
from relax.distributed.placement import parse_resource, start_ray
from relax.engine.rollout.engine_pool import RayEnginePool
from relax.engine.rollout.sglang_rollout import GenerateState
from relax.metrics import console
from relax.metrics.artifacts import RunArtifacts
from relax.weights.sync import sync_weights


def _rollout_metrics(samples, raw_rewards: list[float], seconds: float) -> dict[str, float]:
    import numpy as np

    rewards = np.array(raw_rewards, dtype=np.float64)
    lengths = np.array([s.response_length for s in samples], dtype=np.float64)
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()),
        "rollout/response_len_mean": float(lengths.mean()),
        "rollout/num_samples": float(len(samples)),
        "rollout/tokens_per_s": float(lengths.sum() / max(seconds, 1e-9)),
        "rollout/staleness_max": 0.0,
        "rollout/staleness_mean": 0.0,
    }


def _save(args: Namespace, trainer, data_source, artifacts: RunArtifacts, step: int) -> None:
    directory = ckpt.iteration_dir(args.save, step)
    ray.get(trainer.save.remote(str(directory), not args.no_save_optim))
    ckpt.write_driver_state(directory, ckpt.DriverState(step + 1, step + 1, data_source.state_dict()))
    ckpt.mark_latest(args.save, step)
    artifacts.event("checkpoint_saved", step=step, path=str(directory))


def _due(interval: int | None, step: int, last: int) -> bool:
    return step == last or bool(interval and (step + 1) % interval == 0)


def train_colocate(args: Namespace, run: RunInputs, artifacts: RunArtifacts) -> None:
    use_gpu = run.device == "cuda"
    placement = parse_resource(args, use_gpu)
    start_ray(use_gpu)
    trainer = TrainerActor.options(**placement.actor_options("actor")).remote(args, run.device)
    engines = [
        EngineActor.options(**placement.actor_options("rollout")).remote(args, run.device, i)
        for i in range(placement.rollout.replicas)
    ]
    artifacts.event("process_started", role="trainer:0", pid=ray.get(trainer.pid.remote()))
    for i, engine in enumerate(engines):
        artifacts.event("process_started", role=f"engine:{i}", pid=ray.get(engine.pid.remote()))
    console.info(f"trainer up: {ray.get(trainer.describe.remote())}; {len(engines)} engine(s)")
    GenerateState.install(args, tokenizer=run.tokenizer, pool=RayEnginePool(engines))

    start_step = 0
    if args.load:
        directory = ckpt.find_latest(args.load)
        state = ckpt.read_driver_state(directory)
        ray.get(trainer.load.remote(str(directory)))
        run.data_source.load_state_dict(state.data_source)
        start_step = state.next_step
        artifacts.event("resume", step=start_step, path=str(directory))
        console.info(f"resumed from {directory} at step {start_step}")

    bucket = args.update_weight_buffer_size
    sync_weights(trainer, engines, version=start_step, step=start_step, bucket_bytes=bucket, artifacts=artifacts)
    last = run.num_rollout - 1
    for step in range(start_step, run.num_rollout):
        t0 = time.perf_counter()
        artifacts.event("step_start", step=step)
        artifacts.event("phase", step=step, phase="rollout")
        groups = run.rollout_fn(args, step, run.data_source)
        samples, raw_rewards = to_train_samples(args, groups)
        t1 = time.perf_counter()
        artifacts.event("phase", step=step, phase="train")
        train_metrics = ray.get(trainer.train_rollout.remote(samples, step))
        t2 = time.perf_counter()
        artifacts.event("phase", step=step, phase="sync")
        sync_s = sync_weights(trainer, engines, version=step + 1, step=step, bucket_bytes=bucket, artifacts=artifacts)
        for g in groups:
            for s in g:
                artifacts.samples.write(
                    {"step": step, "group_index": s.group_index, "index": s.index,
                     "attempts": s.abort_count + 1, "fate": "trained", "reason": None}
                )
        if args.save and _due(args.save_interval, step, last):
            artifacts.event("phase", step=step, phase="checkpoint")
            _save(args, trainer, run.data_source, artifacts, step)
        if args.save_hf and _due(args.save_interval, step, last):
            ray.get(trainer.save_hf.remote(args.save_hf.format(rollout_id=step)))
        step_s = time.perf_counter() - t0
        metrics = {
            "step": step,
            "weight_version": step,
            "time": time.time(),
            **_rollout_metrics(samples, raw_rewards, t1 - t0),
            **train_metrics,
            "perf/rollout_time_s": t1 - t0,
            "perf/train_time_s": t2 - t1,
            "perf/sync_time_s": sync_s,
            "perf/step_time_s": step_s,
            "perf/tokens_per_s": sum(len(s.tokens) for s in samples) / max(step_s, 1e-9),
        }
        artifacts.metrics.write(metrics)
        artifacts.log_step(metrics)
        artifacts.event("step_end", step=step)
        console.print_step(metrics, run.num_rollout)
