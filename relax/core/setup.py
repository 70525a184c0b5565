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
from relax.utils.arguments import ConfigError, args_to_dict
from relax.utils.plugins import load_function, load_object

DEFAULT_DATA_SOURCE = "relax.engine.rollout.data_source.RolloutDataSourceWithBuffer"


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
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

    device = resolve_device(args.device)
    if not args.custom_rm_path:
        if not args.rm_type:
            raise ConfigError("set --rm-type or --custom-rm-path (no reward function configured)")
        get_reward_fn(args.rm_type)
    else:
        load_function(args.custom_rm_path, flag="--custom-rm-path", signature="reward_func(args, sample, **kwargs)")
    tokenizer = load_tokenizer(args.hf_checkpoint)
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
    _check_train_data_hooks(args)
    from relax.engine.rollout.evaluation import load_eval_sets

    if args.eval_interval and not args.eval_prompt_data:
        raise ConfigError("--eval-interval needs --eval-prompt-data NAME PATH")
    return RunInputs(device, tokenizer, data_source, rollout_fn, num_rollout, load_eval_sets(args, tokenizer))


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
        "dtypes": run_dtypes(args),
        "seeds": {"seed": args.seed, "rollout_seed": args.rollout_seed},
        "output_dir": str(args.output_dir),
        "start_time": time.time(),
        "end_time": None,
        "exit_code": None,
        "error": None,
        **extra,
    }


def run_dtypes(args: Namespace) -> dict[str, str]:
    """The dtypes the trainer computes log-probs in and the engines hold weights in (the harness picks its
    numeric tolerances by them). Both are the train backend's export dtype (relax/backends/train_registry.py):
    the torch backend trains and exports fp32, Megatron bf16, and engines hold what the trainer exports."""
    from relax.backends.train_registry import weight_dtype

    dtype = str(weight_dtype(args.train_backend)).removeprefix("torch.")
    return {"trainer": dtype, "engine": dtype}
