"""Global restarts (``--use-health-check``): a dead or hung service restarts the whole run
from the latest checkpoint, at most ``--max-global-restart`` times.

A heartbeat thread pings the trainer every ``--rollout-health-check-interval`` seconds; no
answer within ``--rollout-health-check-timeout`` (a hung process) gets it killed, which turns
the hang into an actor error the loop sees. Any actor death then tears every actor down and
starts them again from ``--save``'s latest checkpoint (or from the start of the run when none
was written yet), so a fault costs at most the steps since the last checkpoint.
"""

from __future__ import annotations

import json
import threading
from argparse import Namespace
from pathlib import Path

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from relax import checkpoint as ckpt
from relax.core.runtime import Runtime, start_runtime
from relax.core.setup import RunInputs
from relax.engine.rollout.engine_pool import EngineDiedError
from relax.metrics import console
from relax.metrics.artifacts import RunArtifacts
from relax.utils.gc_pauses import freeze_startup_objects


class GlobalRestartError(RuntimeError):
    """Services kept failing: more global restarts than --max-global-restart allows."""


class TrainerHeartbeat:
    def __init__(self, rt: Runtime):
        self.rt = rt
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="relax-heartbeat", daemon=True)

    def _loop(self) -> None:
        args = self.rt.args
        if self._stop.wait(args.rollout_health_check_first_wait):
            return
        while not self._stop.wait(args.rollout_health_check_interval):
            try:
                ray.get(self.rt.trainer.pid.remote(), timeout=args.rollout_health_check_timeout)
            except (GetTimeoutError, RayActorError) as exc:
                self.rt.artifacts.event("fault_detected", role="trainer:0", reason=f"heartbeat: {type(exc).__name__}")
                ray.kill(self.rt.trainer, no_restart=True)
                return

    def __enter__(self) -> TrainerHeartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def _has_checkpoint(root: str | None) -> bool:
    return bool(root) and (Path(root) / ckpt.LATEST_FILE).exists()


def _recycle_rolled_back_samples(artifacts: RunArtifacts, resume_step: int) -> None:
    """Samples trained at or after ``resume_step`` were rolled back: record them as recycled (they are redrawn)."""
    path = artifacts.dir / "samples.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for rec in records:
        if rec["fate"] == "trained" and rec["step"] >= resume_step:
            artifacts.samples.write({**rec, "fate": "recycled", "reason": f"global_restart: rolled back to step {resume_step}"})


def train_with_restarts(loop, args: Namespace, run: RunInputs, artifacts: RunArtifacts) -> None:
    """Run ``loop(rt)``; with --use-health-check, restart everything after a service dies."""
    initial_data = run.data_source.state_dict()
    original_load = args.load
    restarts = 0
    while True:
        rt = start_runtime(args, run, artifacts)
        freeze_startup_objects()  # the driver's imports and setup: full GCs skip them (relax/utils/gc_pauses.py)
        try:
            if args.use_health_check:
                with TrainerHeartbeat(rt):
                    loop(rt)
            else:
                loop(rt)
            return
        except (RayActorError, EngineDiedError) as exc:
            if not args.use_health_check:
                raise
            restarts += 1
            reason = str(exc).splitlines()[0][:200]
            if restarts > args.max_global_restart:
                raise GlobalRestartError(
                    f"a service failed {restarts} times, more than --max-global-restart {args.max_global_restart} "
                    f"allows; last failure: {reason}"
                ) from None
            if _has_checkpoint(args.save):
                args.load = args.save
            else:
                args.load = original_load
                if original_load is None:
                    run.data_source.load_state_dict(initial_data)
            resume_step = ckpt.read_driver_state(ckpt.find_latest(args.load)).next_step if args.load else 0
            _recycle_rolled_back_samples(artifacts, resume_step)
            artifacts.event("restart", role="global", count=restarts, reason=reason, load=args.load,
                            resume_step=resume_step)
            console.info(f"global restart {restarts}/{args.max_global_restart} from {args.load or 'the start'}: {reason}")
        finally:
            rt.shutdown()
