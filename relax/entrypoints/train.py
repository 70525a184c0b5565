"""``relax train`` / ``python3 relax/entrypoints/train.py``: parse, prepare, run, report.

User mistakes (bad flags, missing or malformed data, unknown reward, broken checkpoint)
end with one line ``relax: <what is wrong>`` and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import sys
import time
import traceback

if __package__ in (None, ""):  # run as a script: make the repository importable
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from relax.utils.arguments import ConfigError, parse_args  # noqa: E402

EXIT_CONFIG = 2
EXIT_FAILED = 1


def _user_errors() -> tuple[type[BaseException], ...]:
    from relax.checkpoint import CheckpointError
    from relax.core.restarts import GlobalRestartError
    from relax.data.dataset import DataError
    from relax.engine.rollout.opd_teacher import TeacherError
    from relax.utils.plugins import PluginError

    return (ConfigError, DataError, PluginError, CheckpointError, GlobalRestartError, TeacherError)


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        print(f"relax: {exc}", file=sys.stderr)
        return EXIT_CONFIG

    from relax.core.colocate import train_colocate
    from relax.core.fully_async import train_fully_async
    from relax.core.restarts import train_with_restarts
    from relax.core.setup import prepare_run, run_json
    from relax.metrics import console
    from relax.metrics.artifacts import RunArtifacts

    artifacts = RunArtifacts(args.output_dir)
    artifacts.event("run_start", argv=sys.argv[1:] if argv is None else argv)
    info = run_json(args, args.device, "running")
    artifacts.write_run_json(info)
    code, error = 0, None
    try:
        run = prepare_run(args)
        info["device"] = run.device
        artifacts.write_run_json(info)
        if args.use_tensorboard:
            from relax.metrics.tensorboard import TensorBoardLogger

            tb = TensorBoardLogger(str(args.output_dir), args.tb_project_name, args.tb_experiment_name)
            artifacts.add_step_logger(tb)
            console.info(f"tensorboard logs in {tb.log_dir}")
        console.info(f"output dir {args.output_dir}; {run.num_rollout} steps on {run.device}")
        train_with_restarts(train_fully_async if args.fully_async else train_colocate, args, run, artifacts)
    except _user_errors() as exc:  # also raised in an actor (a user hook in the trainer): Ray wraps it
        error = str(getattr(exc, "cause", None) or exc)
        code = EXIT_CONFIG if isinstance(exc, ConfigError) else EXIT_FAILED
        print(f"relax: {error}", file=sys.stderr)
    except KeyboardInterrupt:
        code, error = 130, "interrupted"
        print("relax: interrupted", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - report, record and exit non-zero
        cause = getattr(exc, "cause", None) or exc  # a Ray task error wraps the worker's exception
        code, error = EXIT_FAILED, f"{type(cause).__name__}: {cause}".splitlines()[0]
        traceback.print_exc()
        print(f"relax: run failed: {error}", file=sys.stderr)
    finally:
        _shutdown_ray()
    info.update(status="completed" if code == 0 else "failed", exit_code=code, error=error, end_time=time.time())
    artifacts.write_run_json(info)
    artifacts.event("run_end", status=info["status"], exit_code=code)
    artifacts.close()
    if code == 0:
        console.info(f"done. artifacts in {args.output_dir}: metrics.jsonl weights.jsonl events.jsonl samples.jsonl run.json")
    return code


def _shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":
    sys.exit(main())
