"""Parse-time rules for ``--train-backend megatron`` (cheap: no megatron import, no CUDA init on CPU-only flags)."""

from __future__ import annotations

from argparse import Namespace

from relax.utils.flag_types import ConfigError
from relax.utils.modules import module_available

__all__ = ["MEGATRON_ONLY_FLAGS", "check_train_backend_args", "module_available"]

MEGATRON_ONLY_FLAGS = ("use_distributed_optimizer", "no_bias_swiglu_fusion", "no_bias_dropout_fusion",
                       "no_rope_fusion", "sequence_parallel")
PARALLEL_SIZE_FLAGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                       "expert_model_parallel_size", "expert_tensor_parallel_size")


def check_train_backend_args(args: Namespace) -> None:
    if args.train_backend != "megatron":
        for dest in MEGATRON_ONLY_FLAGS:
            if getattr(args, dest):
                raise ConfigError(f"--{dest.replace('_', '-')} needs --train-backend megatron")
        for dest in PARALLEL_SIZE_FLAGS:
            if getattr(args, dest) != 1:
                raise ConfigError(f"--{dest.replace('_', '-')} {getattr(args, dest)} needs --train-backend megatron "
                                  f"(the {args.train_backend} backend is data-parallel only)")
        return
    if not module_available("megatron.core"):
        raise ConfigError("--train-backend megatron needs megatron-core (pip install 'relax-harness[megatron]'), "
                          "or use --train-backend torch")
    if args.device == "cpu" or (args.device == "auto" and not _cuda_available()):
        raise ConfigError("--train-backend megatron needs a CUDA GPU: megatron-core does not run on CPU "
                          "(use --train-backend torch)")
    if args.megatron_to_hf_mode == "bridge":
        from relax.backends.megatron.bridge import bridge_problem

        problem = bridge_problem(args.hf_checkpoint)
        if problem:
            raise ConfigError(problem)
    if args.advantage_estimator == "ppo":
        raise ConfigError("not supported yet: --advantage-estimator ppo with --train-backend megatron (the critic)")
    _check_parallel(args)


def _check_parallel(args: Namespace) -> None:
    """The parallel sizes against the trainer's ranks and, when any is > 1, against the model's config."""
    from relax.backends.megatron.parallel import ParallelSizes, check_model_fits, check_parallel_flags
    from relax.distributed.resources import trainer_ranks

    sizes = ParallelSizes.from_args(args)
    check_parallel_flags(sizes, trainer_ranks(args), te_available=module_available("transformer_engine"))
    if sizes.is_trivial():
        return
    from relax.backends.megatron.config import McoreModelSpec, UnsupportedModelError
    from relax.models import resolve_checkpoint

    try:
        config = resolve_checkpoint(args.hf_checkpoint).config
    except ValueError:  # an unknown --hf-checkpoint fails with its own message when the run loads it
        return
    try:
        check_model_fits(sizes, McoreModelSpec.from_hf(config))
    except UnsupportedModelError as exc:
        raise ConfigError(f"--hf-checkpoint {args.hf_checkpoint}: {exc}") from None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
