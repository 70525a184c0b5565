"""Parse-time rules for ``--train-backend megatron`` (cheap: no megatron import, no CUDA init on CPU-only flags)."""

from __future__ import annotations

from typing import Any

from relax.backends.megatron.megatron_config import MEGATRON_ONLY_FLAGS, PARALLEL_SIZE_FLAGS, MegatronConfig
from relax.utils.flag_types import ConfigError
from relax.utils.modules import module_available

__all__ = ["MEGATRON_ONLY_FLAGS", "PARALLEL_SIZE_FLAGS", "check_train_backend", "module_available"]


def check_train_backend(cfg: MegatronConfig, resource: Any) -> None:
    """The Megatron flags need ``--train-backend megatron``; that backend needs megatron-core, a GPU and parallel
    sizes that fit the trainer's ranks (``resource``: ``--resource``) and the model."""
    if cfg.train_backend != "megatron":
        for dest in MEGATRON_ONLY_FLAGS:
            if getattr(cfg, dest):
                raise ConfigError(f"--{dest.replace('_', '-')} needs --train-backend megatron")
        for dest in PARALLEL_SIZE_FLAGS:
            if getattr(cfg, dest) != 1:
                raise ConfigError(f"--{dest.replace('_', '-')} {getattr(cfg, dest)} needs --train-backend megatron "
                                  f"(the {cfg.train_backend} backend is data-parallel only)")
        return
    if not module_available("megatron.core"):
        raise ConfigError("--train-backend megatron needs megatron-core (pip install 'relax-harness[megatron]'), "
                          "or use --train-backend torch")
    if cfg.device == "cpu" or (cfg.device == "auto" and not _cuda_available()):
        raise ConfigError("--train-backend megatron needs a CUDA GPU: megatron-core does not run on CPU "
                          "(use --train-backend torch)")
    if cfg.megatron_to_hf_mode == "bridge":
        from relax.backends.megatron.bridge import bridge_problem

        problem = bridge_problem(cfg.hf_checkpoint)
        if problem:
            raise ConfigError(problem)
    _check_parallel(cfg, resource)


def _check_parallel(cfg: MegatronConfig, resource: Any) -> None:
    """The parallel sizes against the trainer's ranks and, when any is > 1, against the model's config."""
    from relax.backends.megatron.parallel import ParallelSizes, check_model_fits, check_parallel_flags
    from relax.distributed.resources import trainer_ranks

    sizes = ParallelSizes.of(cfg)
    check_parallel_flags(sizes, trainer_ranks(resource), te_available=module_available("transformer_engine"))
    if sizes.is_trivial():
        return
    from relax.backends.megatron.config import McoreModelSpec, UnsupportedModelError
    from relax.models import resolve_checkpoint

    try:
        config = resolve_checkpoint(cfg.hf_checkpoint).config
    except ValueError:  # an unknown --hf-checkpoint fails with its own message when the run loads it
        return
    try:
        check_model_fits(sizes, McoreModelSpec.from_hf(config, cfg.model_name))
    except UnsupportedModelError as exc:
        raise ConfigError(f"--hf-checkpoint {cfg.hf_checkpoint}: {exc}") from None


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()
