"""What both training loops share: actors up, resume, weight sync, per-step bookkeeping.

The colocate loop (colocate.py) and the fully-async loop (fully_async.py) differ only in
how rollout and training are scheduled; everything a step leaves behind (metrics, sample
accounting, checkpoints, HF exports) is written here, the same way for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from argparse import Namespace
from dataclasses import dataclass, field

import numpy as np
import ray
from ray.exceptions import GetTimeoutError, RayActorError

from relax import checkpoint as ckpt
from relax.backends.config import TrainerConfig
from relax.backends.torch.step_report import CONSUMED_KEY
from relax.core.autoscaler import Autoscaler, AutoscalerFlags, RuntimeFleet
from relax.core.elastic import ElasticConfig, FleetScaler
from relax.core.engines import EngineFleet
from relax.core.eval_log_hook import apply_hook as apply_eval_hook
from relax.core.rollout_log_hook import apply_hook
from relax.core.saver import CheckpointSaver
from relax.core.services import ServiceGroup
from relax.core.setup import RunInputs
from relax.distributed.actors import TrainerActor
from relax.distributed.cluster import cluster_address, start_ray
from relax.distributed.config import PlacementConfig
from relax.distributed.placement import Placement, where
from relax.distributed.resources import plan_resources
from relax.distributed.trainer_group import TrainerGroup
from relax.engine.rollout.engine_client import EngineClient, EngineError
from relax.engine.rollout.engine_pool import HttpEnginePool
from relax.engine.rollout.sglang_rollout import GenerateState
from relax.metrics import console
from relax.metrics.artifacts import RunArtifacts
from relax.metrics.sample_records import reward_extras, sample_fields
from relax.observability.collective_memory import SUMMARY_KEY as COLLECTIVE_MEMORY_KEY
from relax.observability.rollout_logs import RolloutLogConfig, rollout_log_metrics
from relax.observability.sglang_profile import EngineProfiling, SglangProfileConfig
from relax.observability.spans import RECORDER, SPANS_KEY
from relax.utils.gc_pauses import freeze_startup_objects
from relax.utils.types import Sample
from relax.weights.push import PushOptions
from relax.weights.sync import record_push
from relax.weights.transports import SyncTarget

FREEZE_AFTER_STEPS = 2  # the first steps compile and capture graphs; the objects they leave are frozen after each


@dataclass
class Runtime:
    args: Namespace
    run: RunInputs
    artifacts: RunArtifacts
    # the trainer ranks, and with more than one the rendezvous store their process group lives on: NCCL (and
    # gloo under TORCH_GLOO_LAZY_INIT) opens each communicator through it at its first collective, so the
    # runtime holds the group for the whole run (None: --debug-rollout-only)
    trainer_group: TrainerGroup | None
    fleet: EngineFleet  # the engines, reached over SGLang's HTTP API behind the run's router
    start_step: int = 0
    version: int = 0  # weight version the engines hold
    step: int = 0  # the step in progress (for sync records)
    supervisor: object = None  # EngineSupervisor with --use-fault-tolerance
    teacher: object = None  # opd_teacher.TeacherServer with --opd-type sglang
    genrm: object = None  # genrm_engines.GenRMEngines with --genrm-model-path
    services: ServiceGroup | None = None  # fully-async reference / actor_fwd / advantages roles
    # held by every sync and restart: a restart never interleaves with a sync (EngineSupervisor shares it)
    weights_lock: threading.RLock = field(default_factory=threading.RLock)
    # held by a rollout while it generates (fully-async producer): a sync lands between two rollouts, never
    # inside one, so every request's tokens come from one weight version
    generation_lock: threading.RLock = field(default_factory=threading.RLock)
    placement: Placement | None = None  # the GPUs reserved for the run's actors (released at shutdown)
    profiling: EngineProfiling | None = None  # --sglang-profile: the engines' profilers around chosen rollouts
    saver: CheckpointSaver | None = None  # --save, --async-save, --max-actor-ckpt-to-keep (relax/core/saver.py)
    scaler: FleetScaler | None = None  # engines joining and leaving the run (relax/core/elastic.py)
    control: object = None  # --fleet-control-addr: the fleet's HTTP control endpoint (relax/core/fleet_control.py)
    autoscaler: object = None  # --autoscaler-config: scales the fleet on the run's signals (relax/core/autoscaler.py)
    posters: object = None  # --use-distributed-post: the POSTs' actors (relax/engine/rollout/distributed_post.py)

    @property
    def trainer(self):
        """Rank 0 of the trainer group, the only rank the driver calls (None: --debug-rollout-only)."""
        return self.trainer_group.leader if self.trainer_group is not None else None

    @property
    def last_step(self) -> int:
        return self.run.num_rollout - 1

    @property
    def push_options(self) -> PushOptions:
        args = self.args
        # the host copy of the last sync's bytes (relax/weights/push.py Snapshot): restarted or joining engines get it;
        # --disable-weights-backuper keeps none (validation refuses it with the features that need it)
        keep = (bool(args.use_fault_tolerance) or (self.scaler is not None and self.scaler.cfg.keeps_snapshot)
                or self.autoscaler is not None)
        keep = keep and not args.disable_weights_backuper
        return PushOptions(transport=args.weight_sync_transport, bucket_bytes=args.update_weight_buffer_size,
                           keep_snapshot=keep, timeout_s=self._sync_timeout(),
                           group_backend=args.checkpoint_engine_backend)

    def engine_profile(self, step: int) -> contextlib.AbstractContextManager:
        """Around step ``step``'s rollout: the engines' profilers when --sglang-profile selects the step."""
        return self.profiling.rollout(step) if self.profiling is not None else contextlib.nullcontext()

    @property
    def sync_interval(self) -> int:
        """``--update-weights-interval``: the engines get the trainer's weights after every this many steps."""
        return int(self.args.update_weights_interval)

    def sync_due(self, step: int) -> bool:
        """Whether step ``step`` ends with a weight sync (version ``step + 1``)."""
        return (step + 1) % self.sync_interval == 0

    def held_version(self, step: int) -> int:
        """The weight version the engines hold while step ``step`` rolls out when every due sync has landed:
        the start version, then ``step + 1`` of the last step that ended with a sync (``step`` itself with
        ``--update-weights-interval 1``)."""
        return max(self.start_step, step - step % self.sync_interval)

    def sync_targets(self) -> list[SyncTarget]:
        return self.fleet.live_targets() + (self.services.sync_targets() if self.services else [])

    def sync(self, version: int, step: int) -> float:
        """Push the trainer's weights to every engine (and the actor_fwd service) as ``version``; with fault
        tolerance, replace engines that died (or hang) meanwhile, then retry."""
        if self.trainer is None or not self.fleet.live_records():  # the debug modes: nothing to sync from, or to
            return 0.0
        with self.weights_lock, self.generation_lock:
            self.version, self.step = version, step
            while True:
                targets = self.sync_targets()
                try:
                    if self.args.check_weight_update_equal:  # a tensor the sync misses keeps its noise
                        _reset_tensors(targets, self._sync_timeout())
                        self.artifacts.event("weights_reset", version=version)
                    start = time.perf_counter()
                    report = ray.get(self.trainer.push_weights.remote(targets, version, self.push_options))
                    elapsed = time.perf_counter() - start
                    record_push(self.artifacts, report, step=step, seconds=elapsed)
                    return elapsed
                except (RayActorError, EngineError, GetTimeoutError) as exc:
                    if self.supervisor is None and isinstance(exc, EngineError):
                        raise self.fleet.failure(exc) from None
                    if self.supervisor is None or not self.trainer_alive() or not self.services_alive():
                        raise
                    self.supervisor.check_all()  # replaces (and re-syncs) the dead or hung engines, then retry

    def _sync_timeout(self) -> float:
        """How long one engine call of a sync (or a memory move) may take: ``--weight-sync-timeout``. With fault
        tolerance a hung engine must not hold the sync long either (the health thread waits for the lock this
        sync holds): a wait longer than this counts as a failed engine."""
        bound = float(self.args.weight_sync_timeout)
        if not self.args.use_fault_tolerance:
            return bound
        return min(bound, max(30.0, 4 * float(self.args.rollout_health_check_timeout)))

    def train_rollout(self, samples, step: int) -> dict[str, float]:
        """Train one rollout batch on the trainer actor; the one place both loops hand data to training.

        ``samples``: a list of train samples, or a handle whose ``fetch()`` returns them (the data
        queue's `StoredBatch`; every consumer fetches for itself). With the fully-async services the
        old/ref log-probs and advantages are computed there first (relax/core/services.py).
        """
        if self.trainer is None:  # --debug-rollout-only
            return {}
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
        from relax.core.eval_function import run_eval_function
        from relax.engine.rollout.evaluation import run_eval

        run = self.run
        if not (run.eval_sets or run.eval_fn) or not run.eval_config.due(step):
            return {}
        self.artifacts.event("phase", step=step, phase="eval")
        start = time.perf_counter()
        data: dict[str, dict[str, list]] = {}
        if run.eval_fn is not None:  # --eval-function-path (relax/core/eval_function.py)
            metrics, data = run_eval_function(run.eval_fn, self.args.eval_function_path, self.args, step, run.data_source)
        else:
            metrics = run_eval(run.eval_config, run.rollout_config, run.reward_config, step, run.eval_sets, data)
        metrics = apply_eval_hook(self.args, step, data, metrics)  # --custom-eval-rollout-log-function-path
        return {**metrics, "perf/eval_time_s": time.perf_counter() - start}

    def resync(self, index: int) -> float:
        """Bring restarted engine ``index`` (not yet behind the router) to the last synced version."""
        return self.resync_targets([self.fleet.records[index].target])

    def resync_targets(self, targets: list[SyncTarget], timeout_s: float | None = None) -> float:
        """Give ``targets`` (engines not behind the router: restarted or joining) the last sync's own bytes, at
        the last synced version; both sides' checksums go to weights.jsonl. ``timeout_s``: GetTimeoutError past it."""
        if self.trainer is None:
            raise RuntimeError("no trainer to take weights from (--debug-rollout-only)")
        with self.weights_lock:
            start = time.perf_counter()
            report = ray.get(self.trainer.resync.remote(targets), timeout=timeout_s)
            elapsed = time.perf_counter() - start
            record_push(self.artifacts, report, step=self.step, seconds=elapsed, resync=True)
            return elapsed

    def scale_out(self, count: int) -> dict:
        """Start ``count`` more engines; each joins the router holding the current weights (relax/core/elastic.py)."""
        return self.scaler.scale_out(count)

    def scale_in(self, indices: list[int]) -> dict:
        """Drain, abort (back to the buffer) and stop engines ``indices`` (relax/core/elastic.py)."""
        return self.scaler.scale_in(indices)

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
        if self.autoscaler is not None:
            self.autoscaler.stop()
        if self.control is not None or self.autoscaler is not None:
            self.scaler.wait_idle()  # a scale operation in progress ends (and is answered) first
            if self.control is not None:
                self.control.stop()
            self.artifacts.event("fleet_final", workers=self.fleet.router.workers_info())
        if self.supervisor is not None:
            self.supervisor.stop()
        if self.teacher is not None:
            from relax.engine.rollout.opd_teacher import stop_teacher

            stop_teacher()
        if self.genrm is not None:
            self.genrm.stop()
        if self.posters is not None:
            from relax.utils.http_utils import install_poster

            install_poster(None)
            self.posters.stop()
        services = list(self.services.actors().values()) if self.services else []
        self.fleet.shutdown()
        for actor in [*(self.trainer_group.actors if self.trainer_group else []), *services]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
        if self.placement is not None:
            self.placement.release()

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
                                         "attempts": s.abort_count + 1, "fate": "trained", "reason": None,
                                         "weight_version": s.weight_version, "staleness": _staleness(s, step),
                                         **sample_fields(s, args.reward_key)})
        for group_index, index, passes in train_metrics.pop(CONSUMED_KEY, []):  # the trainer's own report
            artifacts.samples.write({"step": step, "group_index": group_index, "index": index, "fate": "consumed",
                                     "passes": passes, "reason": None})
        RECORDER.extend(train_metrics.pop(SPANS_KEY, []))  # the trainer's --timeline-dump-dir spans
        if collectives := train_metrics.pop(COLLECTIVE_MEMORY_KEY, None):  # --enable-cuda-memory-check
            artifacts.event("collective_memory", step=step, **collectives)
        rollout_metrics = apply_hook(args, step, [s for g in groups for s in g], rollout_metrics,
                                     float(perf.get("perf/rollout_time_s", 0.0)))
        extras = reward_extras([s for g in groups for s in g], args.reward_key)
        extras.update(rollout_log_metrics(RolloutLogConfig.from_args(args), [s for g in groups for s in g]))
        metrics = {"step": step, "weight_version": weight_version, "time": time.time(),
                   **rollout_metrics, **extras, **GenerateState(args).pop_metrics(step), **train_metrics, **perf}
        if self.autoscaler is not None:
            self.autoscaler.observe_step(step, metrics)
        artifacts.metrics.write(metrics)  # before the checkpoint: a step that trained is in metrics.jsonl even if
        artifacts.log_step(metrics)  # its save fails
        self.saver.check()  # a background save (--async-save) that failed ends the run at the next step
        if self.saver.due(step):
            self.saver.save(step, data_state or self.run.data_source.state_dict)
        if step == self.last_step:
            self.saver.wait()  # the run ends with its last checkpoint written and published
        if args.save_hf and _due(args.save_interval, step, self.last_step):
            ray.get(self.trainer.save_hf.remote(args.save_hf.format(rollout_id=step)))
        artifacts.event("step_end", step=step)
        console.print_step(metrics, self.run.num_rollout)
        if step < self.start_step + FREEZE_AFTER_STEPS:
            self.freeze_gc()

    def freeze_gc(self) -> None:
        """After each of the first steps, whose compiles and graph captures leave many long-lived objects behind,
        freeze what is alive in the driver, the trainer ranks and the engine actors (relax/utils/gc_pauses.py)."""
        actors = [self.trainer] if self.trainer is not None else []
        actors += [r.actor for r in self.fleet.live_records() if r.actor is not None]
        try:
            ray.get([a.freeze_gc.remote() for a in actors])
        except RayActorError:  # an engine that died is the next call's (or the supervisor's) to report
            pass
        freeze_startup_objects()


def _due(interval: int | None, step: int, last: int) -> bool:
    return step == last or bool(interval and (step + 1) % interval == 0)


def fill_weight_versions(groups: list[list[Sample]], version: int) -> int:
    """Give samples without a ``weight_version`` (a custom generate function that sets none) ``version``,
    the version the engines held when the rollout started; returns how many there were."""
    missing = [s for g in groups for s in g if s.weight_version is None]
    for s in missing:
        s.weight_version = version
    return len(missing)


def _staleness(sample: Sample, step: int) -> int:
    """How many versions the weights that generated ``sample`` lag the step that trains on it (the policy
    version lag; 0 when the sample carries no version)."""
    return step - (sample.weight_version if sample.weight_version is not None else step)


def rollout_metrics(groups: list[list[Sample]], raw_rewards: list[float], seconds: float, step: int) -> dict[str, float]:
    samples = [s for g in groups for s in g]
    lengths = np.array([s.response_length for s in samples], dtype=np.float64)
    rewards = np.array(raw_rewards, dtype=np.float64)
    staleness = np.array([_staleness(s, step) for s in samples])
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
        from relax.engine.rollout.teacher_config import TeacherConfig

        teacher = start_teacher(TeacherConfig.from_args(args), run.device, log_dir=str(artifacts.dir))
        artifacts.event("process_started", role="opd_teacher", url=teacher.url,
                        pid=teacher.process.pid if teacher.process is not None else None)
    try:
        rt = _start_services(args, run, artifacts)
    except BaseException:
        if teacher is not None:
            stop_teacher()
        raise
    rt.teacher = teacher
    if args.genrm_model_path:  # the judge's engines: Ray is up now
        from relax.backends.embedded.config import EmbeddedEngineConfig
        from relax.core.genrm_engines import start_genrm
        from relax.engine.rewards.genrm_config import GenRMConfig

        try:
            rt.genrm = start_genrm(GenRMConfig.from_args(args), EmbeddedEngineConfig.from_args(args), run.device,
                                   artifacts)
        except BaseException:
            rt.shutdown()
            raise
    return rt


def _start_services(args: Namespace, run: RunInputs, artifacts: RunArtifacts) -> Runtime:
    """Start Ray and the actors, resume from --load, and push the initial weights (version = start step)."""
    start_ray(run.device == "cuda", cluster_address(args.ray_address))
    # one line, in seconds, when GPUs are missing
    placement_cfg = PlacementConfig.from_args(args)
    placement = Placement.reserve(plan_resources(placement_cfg, run.device), train_env=placement_cfg.train_env())
    artifacts.event("placement", groups=placement.describe())
    launcher, pending = EngineFleet.begin(args, run.device, placement.engines)
    trainer_cfg = TrainerConfig.from_args(args)  # the trainer ranks' and the services' slice of the flags
    services = ServiceGroup.start(trainer_cfg, run.device, placement) if placement.services else None
    # max_concurrency 2: heartbeats are answered while a training step runs
    ranks = [{"max_concurrency": 2, **slot.options} for slot in placement.trainer_ranks]
    group = (TrainerGroup.start(TrainerActor, trainer_cfg, run.device, ranks,
                                timeout_minutes=args.distributed_timeout_minutes, backend=args.distributed_backend)
             if ranks else None)  # none: --debug-rollout-only
    trainer = group.leader if group else None
    fleet = EngineFleet.finish(args, launcher, pending)
    started = [*zip((s.name for s in placement.trainer_ranks), group.actors if group else [], strict=True),
               *(services.actors().items() if services else [])]
    for role, actor in started:
        artifacts.event("process_started", role=role, **where(actor))
    for record in fleet.records:
        extra = where(record.actor) if record.actor is not None else {"pid": record.pid}
        artifacts.event("process_started", role=f"engine:{record.index}", url=record.target.url,
                        **{**extra, "pid": record.pid})
    console.info(f"trainer up: {ray.get(trainer.describe.remote()) if trainer else 'none (--debug-rollout-only)'}; "
                 f"{len(fleet)} {launcher.name} engine(s) behind {fleet.router.url}"
                 + (f"; services {', '.join(services.actors())}" if services else ""))
    rt = Runtime(args, run, artifacts, group, fleet, services=services, placement=placement)
    rt.profiling = EngineProfiling(SglangProfileConfig.from_args(args),
                                   lambda: [(t.url, t.api_key) for t in fleet.live_targets()])
    # recipes post to http://{sglang_router_ip}:{sglang_router_port}/generate, whatever engines stand behind it
    args.sglang_router_ip, port = fleet.router.url.removeprefix("http://").rsplit(":", 1)
    args.sglang_router_port = int(port)
    rt.scaler = FleetScaler(rt, ElasticConfig.from_args(args))
    autoscaling = AutoscalerFlags.from_args(args).load()
    if autoscaling is not None:  # before the first sync: it keeps the bytes a joiner is given
        rt.autoscaler = Autoscaler(autoscaling, RuntimeFleet(rt), artifacts.event)
    if args.use_fault_tolerance:
        from relax.core.fault_tolerance import EngineSupervisor

        rt.supervisor = EngineSupervisor(rt)
    pool = HttpEnginePool(EngineClient(fleet.router.url, timeout=None), supervisor=rt.supervisor,
                          on_failure=fleet.failure, engines=lambda: len(fleet.live_records()),
                          batch_media=launcher.batches_media) if len(fleet) else None
    GenerateState.install(run.rollout_config, tokenizer=run.tokenizer, pool=pool)
    if args.use_distributed_post:  # the rollout's POSTs from poster actors, one per engine
        from relax.engine.rollout.distributed_post import DistributedPoster
        from relax.utils.http_utils import install_poster

        rt.posters = DistributedPoster.start(len(fleet))
        install_poster(rt.posters)
        artifacts.event("process_started", role="posters", pids=rt.posters.pids)
    ckpt_cfg = ckpt.CheckpointConfig.from_args(args)
    rt.saver = CheckpointSaver(ckpt_cfg, trainer, artifacts)
    if args.load:
        rt.start_step = _resume(ckpt_cfg, trainer, run, artifacts)
    if ckpt_cfg.start_rollout_id is not None:  # overrides the step --load's checkpoint names
        rt.start_step = ckpt_cfg.start_rollout_id
        artifacts.event("start_rollout_id", step=rt.start_step)
        console.info(f"starting at rollout step {rt.start_step} (--start-rollout-id)")
    rt.sync(version=rt.start_step, step=rt.start_step)
    if rt.supervisor is not None:
        rt.supervisor.start()
    if rt.scaler.cfg.fleet_control_addr is not None:  # last: a scale request needs the first sync's bytes
        from relax.core.fleet_control import FleetControl

        rt.control = FleetControl.start(rt.scaler)
        artifacts.event("control_endpoint", url=rt.control.url)
    if rt.autoscaler is not None:
        rt.autoscaler.start()
    return rt


def _resume(cfg: ckpt.CheckpointConfig, trainer, run: RunInputs, artifacts: RunArtifacts) -> int:
    """Load --load's latest checkpoint (the critic from --critic-load's checkpoint of the same step, else its
    latest) into the trainer and the data source; returns the step to start at."""
    directory = ckpt.find_latest(cfg.load)
    state = ckpt.read_driver_state(directory)
    critic = None
    if cfg.critic_load_dir:
        same = ckpt.iteration_dir(cfg.critic_load_dir, int(directory.name.removeprefix("iter_")))
        critic = same if (same / ckpt.CRITIC_FILES[0]).exists() else ckpt.find_latest(
            cfg.critic_load_dir, flag="--critic-load", files=ckpt.CRITIC_FILES, driver_state=False)
    ray.get(trainer.load.remote(str(directory), str(critic) if critic else None))
    run.data_source.load_state_dict(state.data_source)
    artifacts.event("resume", step=state.next_step, path=str(directory), critic=str(critic) if critic else None)
    console.info(f"resumed from {directory} at step {state.next_step}" + (f"; critic from {critic}" if critic else ""))
    return state.next_step


def _reset_tensors(targets: list[SyncTarget], timeout_s: float) -> None:
    """``/weights_checker reset_tensors`` on every target (``--check-weight-update-equal``)."""

    from relax.utils.http_utils import run_closing

    async def reset() -> None:
        await asyncio.gather(*(EngineClient(t.url, api_key=t.api_key, weights_timeout=timeout_s)
                               .weights_checker("reset_tensors") for t in targets))

    run_closing(reset())
