"""Parse-time rules for ``--train-backend megatron`` (cheap: no megatron import, no CUDA init on CPU-only flags)."""

from __future__ import annotations

from argparse import Namespace

from relax.utils.flag_types import ConfigError
from relax.utils.modules import module_available

__all__ = ["MEGATRON_ONLY_FLAGS", "check_train_backend_args", "module_available"]

MEGATRON_ONLY_FLAGS = ("use_distributed_optimizer", "no_bias_swiglu_fusion", "no_bias_dropout_fusion")


def check_train_backend_args(args: Namespace) -> None:
    if args.train_backend != "megatron":
        for dest in MEGATRON_ONLY_FLAGS:
            if getattr(args, dest):
                raise ConfigError(f"--{dest.replace('_', '-')} needs --train-backend megatron")
        return
    if not module_available("megatron.core"):
        raise ConfigError("--train-backend megatron needs megatron-core (pip install 'relax-harness[megatron]'), "
                          "or use --train-backend torch")
    if args.device == "cpu" or (args.device == "auto" and not _cuda_available()):
        raise ConfigError("--train-backend megatron needs a CUDA GPU: megatron-core does not run on CPU "
                          "(use --train-backend torch)")
    if args.megatron_to_hf_mode == "bridge":
        from relax.backends.megatron.convert import converters

        try:
            converters("bridge")
        except RuntimeError as exc:
            raise ConfigError(str(exc).removeprefix("relax: ")) from None
    if args.advantage_estimator == "ppo":
        raise ConfigError("not supported yet: --advantage-estimator ppo with --train-backend megatron (the critic)")


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
