"""``relax train`` / ``python3 relax/entrypoints/train.py``: parse, prepare, run, report.

User mistakes (bad flags, missing or malformed data, unknown reward, broken checkpoint) end with
one line per problem, ``relax: <what is wrong>``, and exit 2. SIGINT / SIGTERM end the run with exit 130 / 143,
``run.json`` status ``interrupted`` (relax/utils/interrupts.py). A failure during the run (a hook
that raises, an error inside a Ray actor, a dead engine) ends with one line naming the culprit
(relax/utils/errors.py) and exit 1; ``--debug`` or ``RELAX_DEBUG=1`` adds the full traceback.
run.json records the failure (``error``, ``error_type``, ``error_where``).
"""

from __future__ import annotations

import sys
import time

if __package__ in (None, ""):  # run as a script: make the repository importable
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from relax.utils.arguments import ConfigError, parse_args  # noqa: E402
from relax.utils.interrupts import Interrupted, interruptible, received  # noqa: E402

EXIT_CONFIG = 2
EXIT_FAILED = 1


def _user_errors() -> tuple[type[BaseException], ...]:
    from relax.checkpoint import CheckpointError
    from relax.core.restarts import GlobalRestartError
    from relax.data.dataset import DataError
    from relax.engine.rewards.genrm import GenRMError
    from relax.engine.rollout.opd_teacher import TeacherError
    from relax.utils.plugins import PluginError

    return (ConfigError, DataError, PluginError, CheckpointError, GlobalRestartError, TeacherError, GenRMError)


def _print_problems(exc: ConfigError) -> None:
    for line in exc.problems:
        print(f"relax: {line}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    from relax.utils.gc_pauses import collections_paused

    try:
        with collections_paused():  # set-up's imports (torch, transformers, Ray): relax/utils/gc_pauses.py
            args = parse_args(sys.argv[1:] if argv is None else argv)
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_CONFIG

    from relax.core.setup import prepare_run, run_json
    from relax.metrics import console
    from relax.metrics.artifacts import RunArtifacts
    from relax.metrics.run_dir import claim_run_dir
    from relax.utils.errors import debug_requested, describe

    try:
        lock, appending = claim_run_dir(args.output_dir, resuming=args.load is not None,
                                        overwrite=args.overwrite_output_dir)
    except ConfigError as exc:
        _print_problems(exc)
        return EXIT_CONFIG
    for notice in [*args.notices, *([appending] if appending else [])]:
        console.info(f"notice: {notice}")
    artifacts = RunArtifacts(args.output_dir)
    from relax.observability.config import TimelineConfig
    from relax.observability.timeline import start_timeline, write_timeline

    timeline = TimelineConfig.from_args(args)
    start_timeline(timeline)  # --timeline-dump-dir
    artifacts.event("run_start", argv=sys.argv[1:] if argv is None else argv)
    with collections_paused():  # run.json's versions import transformers
        info = run_json(args, args.device, "running")
    artifacts.write_run_json(info)
    from relax.observability.notify import Notifier, NotifyConfig

    notifier = Notifier(NotifyConfig.from_args(args), warn=console.info)  # --notify-urls
    notifier.started(f"output dir {args.output_dir}")
    code, failure, status, last_lines = 0, None, "completed", []
    with interruptible():
        try:
            with collections_paused():
                run = prepare_run(args)
            info.update(device=run.device, config=run_json(args, run.device, "running")["config"])  # notices, paths
            artifacts.write_run_json(info)
            if args.use_tensorboard:
                from relax.metrics.tensorboard import TensorBoardLogger

                tb = TensorBoardLogger(str(args.output_dir), args.tb_project_name, args.tb_experiment_name)
                artifacts.add_step_logger(tb)
                console.info(f"tensorboard logs in {tb.log_dir}")
            if args.use_clearml:
                from relax.metrics.clearml_logger import ClearMLConfig, ClearMLLogger

                artifacts.add_step_logger(ClearMLLogger(ClearMLConfig.from_args(args), info["config"]))
            console.info(f"output dir {args.output_dir}; {run.num_rollout} steps on {run.device}")
            # the loops import Ray, torch's distributed stack and the backends (seconds): only once the inputs are
            # known good, so a bad path or file is reported in about a second
            with collections_paused():
                from relax.core.colocate import train_colocate
                from relax.core.fully_async import train_fully_async
                from relax.core.restarts import train_with_restarts

            train_with_restarts(train_fully_async if args.fully_async else train_colocate, args, run, artifacts)
        except Interrupted as exc:
            code, status = exc.exit_code, "interrupted"
            info["signal"] = exc.name
            print(f"relax: interrupted by {exc.name}; recording the run's end and stopping Ray", file=sys.stderr)
        except KeyboardInterrupt:  # raised by code that replaced the handler (a hook): as SIGINT
            code, status = 130, "interrupted"
            info["signal"] = "SIGINT"
            print("relax: interrupted", file=sys.stderr)
        except BaseException as exc:  # noqa: BLE001 - every failure: one line (the traceback with --debug), recorded
            signalled = received()
            if signalled is not None:  # the signal surfaced as another error (raised inside a C call)
                code, status = signalled.exit_code, "interrupted"
                info["signal"] = signalled.name
                print(f"relax: interrupted by {signalled.name}; recording the run's end and stopping Ray",
                      file=sys.stderr)
            else:
                code, failure, last_lines = _report(exc, debug_requested(bool(getattr(args, "debug", False))), describe)
                status = "failed"
        # the run's end is on disk before Ray goes down: a shutdown cut short (a second signal, a cluster already
        # killed with the process group) leaves the artifacts complete
        info.update(status=status, exit_code=code, end_time=time.time(),
                    **(failure.record() if failure else {"error": None}))
        if status == "completed":
            notifier.finished(f"completed; artifacts in {args.output_dir}")
        else:
            notifier.failed(f"{status} (exit {code}): {info.get('error') or info.get('signal')}")
        try:
            artifacts.write_run_json(info)
            artifacts.event("run_end", status=status, exit_code=code, **({"signal": info["signal"]}
                                                                          if "signal" in info else {}))
            if (trace := write_timeline(timeline)) is not None:
                console.info(f"timeline (Chrome trace) in {trace}")
            artifacts.close()
        except OSError as exc:  # a full or read-only disk: the run's end cannot be recorded; say so, in one line
            print(f"relax: the run's end is not recorded in {args.output_dir}: {exc.strerror or exc}", file=sys.stderr)
            code = code or EXIT_FAILED
        try:
            _shutdown_ray()
        except Interrupted:  # the first signal came after the run ended: the shutdown was all that was left
            pass
        # the failure's lines come last, after Ray is down: a line a Ray process forwards to this driver's stderr
        # while it shuts down (a raylet's warning) must not follow them
        for line in last_lines:
            print(line, file=sys.stderr)
    lock.release()
    if code == 0:
        console.info(f"done. artifacts in {args.output_dir}: metrics.jsonl weights.jsonl events.jsonl samples.jsonl run.json")
    return code


def _report(exc: BaseException, debug: bool, describe):
    """The failure's exit code, record and stderr lines (printed last by `main`): a user error's own lines, else one
    line naming the culprit; the traceback first when debugging."""
    from relax.utils.errors import unwrap

    original, _ = unwrap(exc)  # a user error raised in an actor (a hook in the trainer): Ray wraps it
    failure = describe(exc)
    out = [failure.traceback.rstrip("\n")] if debug else []
    if isinstance(original, _user_errors()):
        lines = original.problems if isinstance(original, ConfigError) else [str(original)]
        failure.message = "; ".join(lines)
        return ((EXIT_CONFIG if isinstance(original, ConfigError) else EXIT_FAILED), failure,
                [*out, *(f"relax: {line}" for line in lines)])
    return EXIT_FAILED, failure, [*out, f"relax: run failed: {failure.message}"]


def _shutdown_ray() -> None:
    if "ray" in sys.modules:
        import ray

        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":
    from relax.cli import run

    sys.argv.insert(1, "train")  # relax train's quiet exit
    run()
