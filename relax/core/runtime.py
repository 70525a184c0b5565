"""What both training loops share: actors up, resume, weight sync, per-step bookkeeping.

The colocate loop (colocate.py) and the fully-async loop (fully_async.py) differ only in
how rollout and training are scheduled; everything a step leaves behind (metrics, sample
accounting, checkpoints, HF exports) is written here, the same way for both.
"""

from __future__ import annotations

import threading
import time
from argparse import Namespace
from dataclasses import dataclass, field

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from relax import checkpoint as ckpt
from relax.backends.torch.step_report import CONSUMED_KEY
from relax.core.services import ServiceGroup
from relax.core.setup import RunInputs
from relax.distributed.actors import EngineActor, TrainerActor
from relax.distributed.placement import parse_resource, start_ray
from relax.distributed.trainer_group import TrainerGroup
from relax.engine.rollout.engine_pool import RayEnginePool
from relax.engine.rollout.sglang_rollout import GenerateState
from relax.metrics import console
from relax.metrics.artifacts import RunArtifacts
from relax.utils.arguments import ConfigError
from relax.utils.fault_hooks import fault_at
from relax.utils.types import Sample
from relax.weights.broadcast import BroadcastGroup
from relax.weights.sync import WeightSnapshot, resync_from_snapshot, sync_weights


@dataclass
class Runtime:
    args: Namespace
    run: RunInputs
    artifacts: RunArtifacts
    trainer: object  # rank 0 of the trainer group, the only rank the driver calls
    engines: list
    trainer_ranks: list = field(default_factory=list)  # every rank's actor (for shutdown)
    start_step: int = 0
    version: int = 0  # weight version the engines hold
    step: int = 0  # the step in progress (for sync records)
    supervisor: object = None  # EngineSupervisor with --use-fault-tolerance
    teacher: object = None  # opd_teacher.TeacherServer with --opd-type sglang
    services: ServiceGroup | None = None  # fully-async reference / actor_fwd / advantages roles
    snapshot: WeightSnapshot | None = None  # the last sync's bytes, for restarted engines (fault tolerance)
    # held by every sync and restart: a restart never interleaves with a sync (EngineSupervisor shares it)
    weights_lock: threading.RLock = field(default_factory=threading.RLock)
    weight_group: BroadcastGroup = field(default_factory=BroadcastGroup)  # engines on other GPUs (broadcast sync)

    @property
    def last_step(self) -> int:
        return self.run.num_rollout - 1

    def sync(self, version: int, step: int) -> float:
        """Push the trainer's weights to every engine (and the actor_fwd service) as ``version``;
        restart engines that died (or hang) meanwhile, then retry."""
        with self.weights_lock:
            self.version, self.step = version, step
            while True:
                targets = list(enumerate(self.engines)) + (self.services.sync_targets() if self.services else [])
                try:
                    if self.args.check_weight_update_equal:  # a tensor the sync misses keeps its noise
                        ray.get([e.weights_checker.remote("reset_tensors", seed=version) for _, e in targets])
                        self.artifacts.event("weights_reset", version=version)
                    elapsed, snapshot = sync_weights(
                        self.trainer, targets, version=version, step=step,
                        bucket_bytes=self.args.update_weight_buffer_size, artifacts=self.artifacts,
                        timeout=self._sync_timeout(), keep_snapshot=bool(self.args.use_fault_tolerance),
                        transport=self.args.weight_sync_transport, group=self.weight_group)
                    self.snapshot = snapshot
                    return elapsed
                except (RayActorError, GetTimeoutError):
                    if self.supervisor is None or not self.trainer_alive() or not self.services_alive():
                        raise
                    self.supervisor.check_all()  # replaces (and re-syncs) the dead or hung engines, then retry

    def _sync_timeout(self) -> float | None:
        """With fault tolerance a hung engine must not block a sync forever (the health thread waits
        for the lock this sync holds): a wait longer than this counts as a failed engine."""
        if not self.args.use_fault_tolerance:
            return None
        return max(30.0, 4 * float(self.args.rollout_health_check_timeout))

    def train_rollout(self, samples, step: int) -> dict[str, float]:
        """Train one rollout batch on the trainer actor; the one place both loops hand data to training.

        ``samples``: a list of train samples, or a handle whose ``fetch()`` returns them (the data
        queue's `StoredBatch`; every consumer fetches for itself). With the fully-async services the
        old/ref log-probs and advantages are computed there first (relax/core/services.py).
        """
        if self.services is None:
            return ray.get(self.trainer.train_rollout.remote(samples, step))
        start = time.perf_counter()
        payload = samples if hasattr(samples, "fetch") else ray.put(samples)  # one copy for every consumer
        precomputed = self.services.precompute(payload)
        if isinstance(precomputed, ray.ObjectRef):
            ray.wait([precomputed], fetch_local=False)  # only to time the services; errors surface below
        services_s = time.perf_counter() - start
        metrics = ray.get(self.trainer.train_rollout.remote(payload, step, precomputed))
        return {**metrics, "perf/services_time_s": services_s}

    def evaluate(self, step: int) -> dict[str, float]:
        """Eval metrics for this step when ``--eval-interval`` says so (the engines hold version ``step``)."""
        from relax.engine.rollout.evaluation import eval_due, run_eval

        if not self.run.eval_sets or not eval_due(self.args, step):
            return {}
        self.artifacts.event("phase", step=step, phase="eval")
        start = time.perf_counter()
        metrics = run_eval(self.args, step, self.run.eval_sets)
        return {**metrics, "perf/eval_time_s": time.perf_counter() - start}

    def resync(self, index: int, engine) -> float:
        """Bring restarted engine ``index`` (not yet in ``engines``) to the last synced version."""
        with self.weights_lock:
            if self.snapshot is None:
                raise RuntimeError(f"engine:{index} restarted before the first weight sync")
            return resync_from_snapshot(self.snapshot, [(index, engine)], step=self.step, artifacts=self.artifacts,
                                        timeout=self._sync_timeout())

    def trainer_alive(self) -> bool:
        return self._alive(self.trainer)

    def services_alive(self) -> bool:
        return all(self._alive(actor) for actor in (self.services.actors().values() if self.services else ()))

    def _alive(self, actor) -> bool:
        try:
            ray.get(actor.pid.remote(), timeout=self.args.rollout_health_check_timeout)
            return True
        except Exception:  # noqa: BLE001 - any failure means not alive
            return False

    def shutdown(self) -> None:
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.teacher is not None:
            from relax.engine.rollout.opd_teacher import stop_teacher

            stop_teacher()
        services = list(self.services.actors().values()) if self.services else []
        for actor in [*(self.trainer_ranks or [self.trainer]), *self.engines, *services]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass

    def finish_step(self, step: int, groups: list[list[Sample]], rollout_metrics: dict, train_metrics: dict,
                    perf: dict[str, float], weight_version: int, data_state=None) -> None:
        """Account samples, checkpoint when due, write and print the step's metrics.

        ``data_state`` returns the data-source position right after this step's prompts were drawn
        (the fully-async loop draws ahead); by default it is the data source's current position.
        """
        args, artifacts = self.args, self.artifacts
        for fate in GenerateState(args).drain_fates():  # filtered / recycled by the rollout function
            artifacts.samples.write(fate)
        for g in groups:
            for s in g:
                artifacts.samples.write({"step": step, "group_index": s.group_index, "index": s.index,
                                         "attempts": s.abort_count + 1, "fate": "trained", "reason": None})
        for group_index, index, passes in train_metrics.pop(CONSUMED_KEY, []):  # the trainer's own report
            artifacts.samples.write({"step": step, "group_index": group_index, "index": index, "fate": "consumed",
                                     "passes": passes, "reason": None})
        if args.save and _due(args.save_interval, step, self.last_step):
            artifacts.event("phase", step=step, phase="checkpoint")
            directory = ckpt.iteration_dir(args.save, step)
            if fault_at("CKPT_WRITE_FAIL", step):
                raise OSError(f"checkpoint write failed: {directory} (injected fault at step {step})")
            ray.get(self.trainer.save.remote(str(directory), not args.no_save_optim))
            position = data_state() if data_state is not None else self.run.data_source.state_dict()
            ckpt.write_driver_state(directory, ckpt.DriverState(step + 1, step + 1, position))
            ckpt.mark_latest(args.save, step)
            artifacts.event("checkpoint_saved", step=step, path=str(directory))
        if args.save_hf and _due(args.save_interval, step, self.last_step):
            ray.get(self.trainer.save_hf.remote(args.save_hf.format(rollout_id=step)))
        metrics = {"step": step, "weight_version": weight_version, "time": time.time(),
                   **rollout_metrics, **GenerateState(args).pop_metrics(step), **train_metrics, **perf}
        artifacts.metrics.write(metrics)
        artifacts.log_step(metrics)
        artifacts.event("step_end", step=step)
        console.print_step(metrics, self.run.num_rollout)


def _due(interval: int | None, step: int, last: int) -> bool:
    return step == last or bool(interval and (step + 1) % interval == 0)


def rollout_metrics(groups: list[list[Sample]], raw_rewards: list[float], seconds: float, step: int) -> dict[str, float]:
    samples = [s for g in groups for s in g]
    lengths = np.array([s.response_length for s in samples], dtype=np.float64)
    rewards = np.array(raw_rewards, dtype=np.float64)
    staleness = np.array([step - (s.weight_version if s.weight_version is not None else step) for s in samples])
    return {
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/reward_std": float(rewards.std()),
        "rollout/response_len_mean": float(lengths.mean()),
        "rollout/num_samples": float(len(samples)),
        "rollout/tokens_per_s": float(lengths.sum() / max(seconds, 1e-9)),
        "rollout/staleness_max": float(staleness.max()),
        "rollout/staleness_mean": float(staleness.mean()),
    }


def start_runtime(args: Namespace, run: RunInputs, artifacts: RunArtifacts) -> Runtime:
    """Start the OPD teacher server (--opd-type sglang) first, so a dead teacher fails fast, then the rest."""
    teacher = None
    if args.use_opd and args.opd_type == "sglang":
        from relax.engine.rollout.opd_teacher import start_teacher, stop_teacher

        teacher = start_teacher(args, run.device, log_dir=str(artifacts.dir))
        artifacts.event("process_started", role="opd_teacher", url=teacher.url,
                        pid=teacher.process.pid if teacher.process is not None else None)
    try:
        rt = _start_services(args, run, artifacts)
    except BaseException:
        if teacher is not None:
            stop_teacher()
        raise
    rt.teacher = teacher
    return rt


def _start_services(args: Namespace, run: RunInputs, artifacts: RunArtifacts) -> Runtime:
    """Start Ray and the actors, resume from --load, and push the initial weights (version = start step)."""
    use_gpu = run.device == "cuda"
    placement = parse_resource(args, use_gpu)
    start_ray(use_gpu)
    engines = [EngineActor.options(**placement.actor_options("rollout")).remote(args, run.device, i)
               for i in range(placement.rollout.replicas)]
    services = ServiceGroup.start(args, run.device, placement) if placement.services else None
    # max_concurrency 2: heartbeats are answered while a training step runs
    group = TrainerGroup.start(TrainerActor, args, run.device, placement.actor.replicas,
                               {"max_concurrency": 2, **placement.actor_options("actor")})
    trainer = group.leader
    for rank, pid in enumerate(group.pids):
        artifacts.event("process_started", role=f"trainer:{rank}", pid=pid)
    for i, engine in enumerate(engines):
        artifacts.event("process_started", role=f"engine:{i}", pid=ray.get(engine.pid.remote()))
    for role, actor in (services.actors() if services else {}).items():
        artifacts.event("process_started", role=role, pid=ray.get(actor.pid.remote()))
    console.info(f"trainer up: {ray.get(trainer.describe.remote())}; {len(engines)} engine(s)"
                 + (f"; services {', '.join(services.actors())}" if services else ""))
    rt = Runtime(args, run, artifacts, trainer, engines, trainer_ranks=group.actors, services=services)
    if args.custom_generate_function_path and len(engines) > 1:
        raise ConfigError("not supported yet: --custom-generate-function-path with more than one engine "
                          "(needs the router in the training loop)")
    if args.custom_generate_function_path:  # recipes POST to http://{sglang_router_ip}:{sglang_router_port}/generate
        url = ray.get(engines[0].http_url.remote())
        args.sglang_router_ip, port = url.removeprefix("http://").rsplit(":", 1)
        args.sglang_router_port = int(port)
    if args.use_fault_tolerance:
        from relax.core.fault_tolerance import EngineSupervisor

        rt.supervisor = EngineSupervisor(rt, placement.actor_options("rollout"))
    GenerateState.install(args, tokenizer=run.tokenizer, pool=RayEnginePool(engines, supervisor=rt.supervisor))
    if args.load:
        directory = ckpt.find_latest(args.load)
        state = ckpt.read_driver_state(directory)
        ray.get(trainer.load.remote(str(directory)))
        run.data_source.load_state_dict(state.data_source)
        rt.start_step = state.next_step
        artifacts.event("resume", step=rt.start_step, path=str(directory))
        console.info(f"resumed from {directory} at step {rt.start_step}")
    rt.sync(version=rt.start_step, step=rt.start_step)
    if rt.supervisor is not None:
        rt.supervisor.start()
    return rt
