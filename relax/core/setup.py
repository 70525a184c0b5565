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
from pathlib import Path
from typing import TYPE_CHECKING, Any

import relax
from relax.core.debug_rollouts import RolloutRecorder, SavedRollouts
from relax.core.eval_function import BUILTIN as BUILTIN_ROLLOUT
from relax.core.eval_function import custom_eval_path, load_eval_function
from relax.distributed.cluster import cluster_address
from relax.utils.arguments import ConfigError, args_to_dict
from relax.utils.flag_types import Problems
from relax.utils.plugins import PluginError, culprit, load_function, load_object, wrong_answer
from relax.utils.types import Sample

if TYPE_CHECKING:
    from relax.engine.rewards.config import RewardConfig
    from relax.engine.rollout.config import RolloutConfig
    from relax.engine.rollout.eval_config import EvalConfig

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
    # the engine side's typed slices of the flags, built once here (after --hf-checkpoint is final)
    rollout_config: RolloutConfig | None = None
    reward_config: RewardConfig | None = None
    eval_config: EvalConfig | None = None
    eval_fn: Any = None  # --eval-function-path when it is not the built-in evaluation (relax/core/eval_function.py)


def _engine_slices(args: Namespace) -> dict[str, Any]:
    """The rollout, reward and eval slices (relax/engine/...), as `RunInputs` fields."""
    from relax.engine.rewards.config import RewardConfig
    from relax.engine.rollout.config import RolloutConfig
    from relax.engine.rollout.eval_config import EvalConfig

    return {"rollout_config": RolloutConfig.from_args(args), "reward_config": RewardConfig.from_args(args),
            "eval_config": EvalConfig.from_args(args)}


def prepare_run(args: Namespace) -> RunInputs:
    """Check and load everything the run needs, reporting every independent problem at once.

    The reward, the model and tokenizer, the data, the rollout function, the hooks and the eval sets
    are checked one after another, each problem a line of one `ConfigError`; a step that needs what an
    earlier one failed to load (the data needs the tokenizer) is skipped rather than reported twice.
    """
    from relax.data.dataset import DataError

    p = Problems()
    catch = (DataError, PluginError)
    device = p.run(resolve_device, args.device, joins_cluster=bool(cluster_address(args.ray_address)))
    if args.debug_train_only:  # the rollouts (rewards included) come from disk: no prompts, no reward function
        tokenizer = p.run(prepare_model, args, p, catch=catch)
        if tokenizer is not None:  # --hf-checkpoint resolved (else its own line says why)
            p.run(_check_model_provider, args, catch=catch)
        p.run(_check_train_data_hooks, args, catch=catch)
        p.raise_if_any()
        return _replay_inputs(args, device, tokenizer)
    p.run(_check_reward, args, catch=catch)
    tokenizer = p.run(prepare_model, args, p, catch=catch)
    if tokenizer is not None:  # --hf-checkpoint resolved (else its own line says why)
        p.run(_check_model_provider, args, catch=catch)
    data_source = num_rollout = None
    if tokenizer is not None:
        data_source = p.run(_data_source, args, tokenizer, catch=catch)
    if data_source is not None:
        num_rollout = args.num_rollout
        if num_rollout is None:
            num_rollout = data_source.num_rollout_for_epochs(args.num_epoch, args.rollout_batch_size)
    rollout_fn = p.run(load_function, args.rollout_function_path, flag="--rollout-function-path",
                       signature=ROLLOUT_SIGNATURE, min_args=3, catch=catch)
    if rollout_fn is not None and args.rollout_function_path != BUILTIN_ROLLOUT:
        rollout_fn = CheckedRollout(rollout_fn, args.rollout_function_path)
    p.run(_check_train_data_hooks, args, catch=catch)
    if args.slime_router_middleware_paths:
        from relax.engine.router import middleware

        for path in args.slime_router_middleware_paths:
            p.run(middleware.load_class, path, catch=catch)
    if args.custom_generate_function_path:
        from relax.engine.rollout.sglang_rollout import load_generate_function

        p.run(load_generate_function, args.custom_generate_function_path, catch=catch)
    eval_sets = []
    slices = _engine_slices(args)
    eval_fn = None
    if args.eval_interval and custom_eval_path(args.eval_function_path):
        eval_fn = p.run(load_eval_function, args.eval_function_path, catch=catch)
    elif args.eval_interval and not (args.eval_prompt_data or args.eval_config):
        p.add("--eval-interval needs --eval-prompt-data NAME PATH (or --eval-config FILE)")
    elif tokenizer is not None:
        from relax.engine.rollout.evaluation import load_eval_sets

        eval_sets = p.run(load_eval_sets, slices["eval_config"], tokenizer, catch=catch) or []
    p.raise_if_any()
    if args.save_debug_rollout_data:
        rollout_fn = RolloutRecorder(rollout_fn, args.save_debug_rollout_data)
    return RunInputs(device, tokenizer, data_source, rollout_fn, num_rollout, eval_sets, **slices, eval_fn=eval_fn)


def _replay_inputs(args: Namespace, device: str, tokenizer: Any) -> RunInputs:
    """``--debug-train-only``: every step trains on a rollout saved by --save-debug-rollout-data."""
    saved = SavedRollouts(args)
    num_rollout = args.num_rollout or saved.available()
    if not num_rollout:
        raise ConfigError(f"--load-debug-rollout-data: no saved rollout at {args.load_debug_rollout_data}")
    saved.check_steps(num_rollout)
    return RunInputs(device, tokenizer, saved, saved, num_rollout, **_engine_slices(args))


def _check_reward(args: Namespace) -> None:
    from relax.engine.rewards import get_reward_fn

    if args.custom_rm_path:
        from relax.engine.rewards import CUSTOM_RM_SIGNATURE, GROUP_RM_SIGNATURE

        load_function(args.custom_rm_path, flag="--custom-rm-path", min_args=2,
                      signature=GROUP_RM_SIGNATURE if args.group_rm else CUSTOM_RM_SIGNATURE)
    elif not args.rm_type:
        raise ConfigError("set --rm-type or --custom-rm-path (no reward function configured)")
    else:
        get_reward_fn(args.rm_type)


def prepare_model(args: Namespace, p: Problems) -> Any:
    """The tokenizer of ``--hf-checkpoint``, with the model-architecture flags checked against its config.

    A directory with a tokenizer but no config.json gets its model from the flags: written once to
    ``<output-dir>/model_from_flags`` (relax/models/arch_flags.py), which ``--hf-checkpoint`` then names.
    """
    from relax.models import arch_flags, load_tokenizer, resolve_checkpoint

    if not args.hf_checkpoint:
        raise ConfigError("--hf-checkpoint is required (a model preset, or an HF directory with the tokenizer, "
                          "and its config.json and weights unless the model-architecture flags describe the model)")
    tokenizer = load_tokenizer(args.hf_checkpoint)
    if args.apply_chat_template and not getattr(tokenizer, "chat_template", None):
        p.add(f"--apply-chat-template: the tokenizer of {args.hf_checkpoint} has no chat template "
              "(no chat_template in tokenizer_config.json, no chat_template.jinja)")
    directory = Path(args.hf_checkpoint)
    arch = arch_flags.ModelArchConfig.from_args(args)
    if directory.is_dir() and not (directory / "config.json").is_file() and arch_flags.describes_model(arch):
        built = p.run(arch_flags.materialize, arch, tokenizer, Path(args.output_dir) / "model_from_flags",
                      catch=(arch_flags.ArchFlagError,))
        if built is not None:
            args.notices.append(f"{directory} has no config.json: built the model the architecture flags describe "
                                f"(seeded random init) in {built}")
            args.hf_checkpoint = str(built)
        return tokenizer
    checkpoint = resolve_checkpoint(args.hf_checkpoint)
    where = f"{directory / 'config.json'}" if checkpoint.kind == "dir" else f"preset {args.hf_checkpoint!r}"
    for line in arch_flags.check_against_config(arch, checkpoint.config, where):
        p.add(line)
    if args.use_routing_replay and not getattr(checkpoint.config, "num_experts_per_tok", None):
        p.add(f"--use-routing-replay needs a MoE model; {where} describes a dense one (e.g. --hf-checkpoint "
              "small-qwen3-moe)")
    return tokenizer


def _check_model_provider(args: Namespace) -> None:
    """--custom-model-provider-path: loaded, and with the torch backend built on the meta device and checked (type,
    parameter names and shapes against --hf-checkpoint's), here rather than in the trainer actor, far from the user."""
    if args.custom_model_provider_path:
        from relax.models import hf_attention
        from relax.models.provider import check_at_launch

        check_at_launch(args.custom_model_provider_path, args.train_backend, args.hf_checkpoint,
                        hf_attention(args.attention_backend), save_hf=bool(args.save_hf))


ROLLOUT_SIGNATURE = "generate_rollout(args, rollout_id, data_source, evaluation=False) -> list[list[Sample]]"


@dataclass(frozen=True)
class CheckedRollout:
    """A user's ``--rollout-function-path``: what it raises names it, and an answer that is not a list of groups
    (lists) of Samples is refused in one line, before the trainer reads it."""

    fn: Any
    path: str

    def __call__(self, args: Namespace, rollout_id: int, data_source: Any) -> list[list[Any]]:
        with culprit("--rollout-function-path", self.path, f"rollout {rollout_id}"):
            groups = self.fn(args, rollout_id, data_source)
        if not (isinstance(groups, list)
                and all(isinstance(g, list) and all(isinstance(s, Sample) for s in g) for g in groups)):
            shown = type(groups).__name__ if not isinstance(groups, list) else \
                f"a list holding {', '.join(sorted({type(g).__name__ for g in groups}))}"
            raise wrong_answer(f"--rollout-function-path {self.path}", groups, ROLLOUT_SIGNATURE, got=shown)
        return groups


# what the run calls on a --data-source-path object (num_rollout_for_epochs only when --num-rollout is unset)
DATA_SOURCE_METHODS = ("get_samples", "add_samples", "state_dict", "load_state_dict")


def _data_source(args: Namespace, tokenizer: Any) -> Any:
    source_cls = load_object(args.data_source_path)
    source = source_cls(args, tokenizer=tokenizer) if args.data_source_path == DEFAULT_DATA_SOURCE else source_cls(args)
    needed = DATA_SOURCE_METHODS + (("num_rollout_for_epochs",) if args.num_rollout is None else ())
    missing = [m for m in needed if not callable(getattr(source, m, None))]
    if missing:
        raise PluginError(f"--data-source-path {args.data_source_path}: the object it builds has no "
                          f"{', '.join(missing)} (a data source is built as cls(args) and needs {', '.join(needed)})")
    return source


def _check_train_data_hooks(args: Namespace) -> None:
    """Load the train-data hooks now: the post-process one runs in the trainer actor, far from the user."""
    from relax.backends.torch import rollout_postprocess
    from relax.core import eval_log_hook, rollout_log_hook
    from relax.core.train_data import CONVERT_SIGNATURE

    if args.custom_convert_samples_to_train_data_path:
        load_function(args.custom_convert_samples_to_train_data_path, min_args=2, signature=CONVERT_SIGNATURE,
                      flag="--custom-convert-samples-to-train-data-path")
    if args.rollout_data_postprocess_path:
        load_function(args.rollout_data_postprocess_path, flag=rollout_postprocess.FLAG,
                      signature=rollout_postprocess.SIGNATURE, min_args=3)
    if args.custom_rollout_log_function_path:
        rollout_log_hook.check_hook(args.custom_rollout_log_function_path)
    if args.custom_eval_rollout_log_function_path:
        eval_log_hook.check_hook(args.custom_eval_rollout_log_function_path)


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
    the torch backend trains and exports fp32 (bf16 with --bf16), Megatron bf16, and engines hold what the
    trainer exports."""
    from relax.backends.train_registry import weight_dtype

    dtype = str(weight_dtype(args.train_backend, getattr(args, "bf16", False))).removeprefix("torch.")
    return {"trainer": dtype, "engine": dtype}
