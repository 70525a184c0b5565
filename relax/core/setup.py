"""Everything a run needs before any process starts: device, data, reward, step count.

Bad input is caught here, in the driver, before Ray starts, so a wrong path or flag costs
milliseconds and produces one clear line instead of an actor traceback.
"""

from __future__ import annotations

import platform
import sys
import time
from argparse import Namespace
from dataclasses import dataclass, field
from typing import Any

import relax
from relax.core.debug_rollouts import RolloutRecorder, SavedRollouts
from relax.distributed.cluster import cluster_address
from relax.utils.arguments import ConfigError, args_to_dict
from relax.utils.plugins import load_function, load_object

DEFAULT_DATA_SOURCE = "relax.engine.rollout.data_source.RolloutDataSourceWithBuffer"


def resolve_device(requested: str, joins_cluster: bool = False) -> str:
    """``auto``: cuda when this machine has a GPU. On a cluster the actors may have GPUs the driver's node
    lacks: there ``--device cuda`` is trusted, and the placement fails at start if the cluster has none."""
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available() and not joins_cluster:
        raise ConfigError("--device cuda: no CUDA device is available")
    return requested


@dataclass
class RunInputs:
    device: str
    tokenizer: Any
    data_source: Any
    rollout_fn: Any
    num_rollout: int
    eval_sets: list = field(default_factory=list)


def prepare_run(args: Namespace) -> RunInputs:
    from relax.engine.rewards import get_reward_fn
    from relax.models import load_tokenizer

    device = resolve_device(args.device, joins_cluster=bool(cluster_address(args.ray_address)))
    tokenizer = load_tokenizer(args.hf_checkpoint)
    _check_train_data_hooks(args)
    if args.debug_train_only:  # the rollouts (rewards included) come from disk: no prompts, no reward function
        return _replay_inputs(args, device, tokenizer)
    if not args.custom_rm_path:
        if not args.rm_type:
            raise ConfigError("set --rm-type or --custom-rm-path (no reward function configured)")
        get_reward_fn(args.rm_type)
    else:
        load_function(args.custom_rm_path, flag="--custom-rm-path", signature="reward_func(args, sample, **kwargs)")
    source_cls = load_object(args.data_source_path)
    data_source = source_cls(args, tokenizer=tokenizer) if args.data_source_path == DEFAULT_DATA_SOURCE else source_cls(args)
    num_rollout = args.num_rollout
    if num_rollout is None:
        num_rollout = data_source.num_rollout_for_epochs(args.num_epoch, args.rollout_batch_size)
    rollout_fn = load_function(
        args.rollout_function_path,
        flag="--rollout-function-path",
        signature="generate_rollout(args, rollout_id, data_source, evaluation=False) -> list[list[Sample]]",
        min_args=3,
    )
    if args.save_debug_rollout_data:
        rollout_fn = RolloutRecorder(rollout_fn, args.save_debug_rollout_data)
    from relax.engine.rollout.evaluation import load_eval_sets

    if args.eval_interval and not args.eval_prompt_data:
        raise ConfigError("--eval-interval needs --eval-prompt-data NAME PATH")
    return RunInputs(device, tokenizer, data_source, rollout_fn, num_rollout, load_eval_sets(args, tokenizer))


def _replay_inputs(args: Namespace, device: str, tokenizer: Any) -> RunInputs:
    """``--debug-train-only``: every step trains on a rollout saved by --save-debug-rollout-data."""
    saved = SavedRollouts(args)
    num_rollout = args.num_rollout or saved.available()
    if not num_rollout:
        raise ConfigError(f"--load-debug-rollout-data: no saved rollout at {args.load_debug_rollout_data}")
    saved.check_steps(num_rollout)
    return RunInputs(device, tokenizer, saved, saved, num_rollout)


def _check_train_data_hooks(args: Namespace) -> None:
    """Load the train-data hooks now: the post-process one runs in the trainer actor, far from the user."""
    from relax.backends.torch import rollout_postprocess
    from relax.core.train_data import CONVERT_SIGNATURE

    if args.custom_convert_samples_to_train_data_path:
        load_function(args.custom_convert_samples_to_train_data_path, min_args=2, signature=CONVERT_SIGNATURE,
                      flag="--custom-convert-samples-to-train-data-path")
    if args.rollout_data_postprocess_path:
        load_function(args.rollout_data_postprocess_path, flag=rollout_postprocess.FLAG,
                      signature=rollout_postprocess.SIGNATURE, min_args=3)


def run_json(args: Namespace, device: str, status: str, **extra: Any) -> dict[str, Any]:
    import torch
    import transformers

    return {
        "status": status,
        "config": args_to_dict(args),
        "versions": {
            "relax": relax.__version__,
            "python": sys.version.split()[0],
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "platform": platform.platform(),
        },
        "device": device,
        "seeds": {"seed": args.seed, "rollout_seed": args.rollout_seed},
        "output_dir": str(args.output_dir),
        "start_time": time.time(),
        "end_time": None,
        "exit_code": None,
        "error": None,
        **extra,
    }
