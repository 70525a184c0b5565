"""Rules for seed 000's Debug table: replayable rollouts (relax/core/debug_rollouts.py).

``--debug-rollout-only`` runs the engines and no trainer; ``--debug-train-only`` (implied by
``--load-debug-rollout-data``) runs the trainer on saved rollouts and no engines. A flag that only
matters to the missing side would be silently ignored, so it is refused here, naming it.
"""

from __future__ import annotations

from argparse import Namespace

from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError

# Rollout-side flags: nothing reads them when the rollouts come from --load-debug-rollout-data.
_ROLLOUT_SIDE = ("custom_generate_function_path", "rollout_function_path", "partial_rollout", "eval_interval",
                 "over_sampling_batch_size", "dynamic_sampling_filter_path", "use_fault_tolerance",
                 "save_debug_rollout_data", "num_epoch")
# Trainer-side flags: nothing reads them without a trainer.
_TRAINER_SIDE = ("load", "save", "save_hf", "use_health_check", "check_weight_update_equal")


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def _given(args: Namespace, dest: str) -> bool:
    return getattr(args, dest) != FLAGS_BY_NAME[dest.replace("_", "-")].default


def check_offload(args: Namespace) -> None:
    """An explicit offload has nothing to move with one side missing (``--colocate``'s implied one resolves off)."""
    mode = _mode(args)
    if mode is None:
        return
    for dest in ("offload", "offload_train", "offload_rollout"):
        if getattr(args, dest) is True:
            raise ConfigError(f"{_flag(dest)} has no effect with {mode} (trainer and engines never share a device)")


def check(args: Namespace) -> None:
    """The debug flags' own rules and the flags each mode cannot honour."""
    ratio = args.load_debug_rollout_data_subsample
    if ratio is not None:
        if not args.load_debug_rollout_data:
            raise ConfigError("--load-debug-rollout-data-subsample has no effect without --load-debug-rollout-data")
        if not 0 < ratio <= 1:
            raise ConfigError(f"--load-debug-rollout-data-subsample must be in (0, 1], got {ratio}")
    for dest in ("save_debug_rollout_data", "load_debug_rollout_data"):
        path = getattr(args, dest)
        if path is not None:
            _check_template(dest, path)
    if args.debug_rollout_only and args.debug_train_only:
        raise ConfigError("--debug-rollout-only and --debug-train-only exclude each other"
                          + (" (--load-debug-rollout-data implies --debug-train-only)" if args.load_debug_rollout_data
                             else ""))
    mode = _mode(args)
    if mode is None:
        return
    if args.fully_async:
        raise ConfigError(f"not supported yet: {mode} with --fully-async")
    if args.debug_train_only:
        if not args.load_debug_rollout_data:
            raise ConfigError("--debug-train-only needs --load-debug-rollout-data PATH (the rollouts to train on)")
        if args.use_opd and args.opd_type == "sglang":
            raise ConfigError("not supported yet: --opd-type sglang with --debug-train-only (its teacher scores the "
                              "samples as they come from the engines)")
        refused = [dest for dest in _ROLLOUT_SIDE if _given(args, dest)]
        why = "no rollout runs: the samples come from --load-debug-rollout-data"
    else:
        refused = [dest for dest in _TRAINER_SIDE if _given(args, dest)]
        why = "no trainer runs"
    if refused:
        raise ConfigError(f"{_flag(refused[0])} has no effect with {mode} ({why})")


def _mode(args: Namespace) -> str | None:
    if args.debug_train_only:
        return "--debug-train-only"
    return "--debug-rollout-only" if args.debug_rollout_only else None


def _check_template(dest: str, path: str) -> None:
    """``{rollout_id}`` is the only placeholder a path may hold."""
    try:
        path.format(rollout_id=0)
    except (KeyError, IndexError, ValueError) as exc:
        raise ConfigError(f"{_flag(dest)} {path!r}: only the {{rollout_id}} placeholder is allowed ({exc!r})") from None
