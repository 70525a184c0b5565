"""Activation recompute and optimizer CPU offload: relax flags -> megatron-core config fields.

Pure Python (no megatron import), so the mapping runs and is tested on CPU; the cross-flag rules
are checked once at parse time (`relax.utils.validation._megatron_memory`), and again here where
they need the model (its layer count) or the machine the backend runs on (Transformer Engine).

Recompute (`TransformerConfig`, megatron-core 0.19.2 transformer_config.py:1724-1761):

- ``--recompute-granularity full --recompute-method uniform|block --recompute-num-layers N``:
  `TransformerBlock` runs its layers through megatron's reentrant ``tensor_parallel.checkpoint``
  (recompute.py `checkpointed_forward`): uniform checkpoints chunks of N layers, block checkpoints
  the first N layers. Megatron requires both method and N for full.
- ``--recompute-granularity selective``: megatron's default ``recompute_modules=["core_attn"]``,
  core attention checkpointed in every layer (attention.py ``_checkpointed_attention_forward``,
  plain ``tensor_parallel.checkpoint``: no Transformer Engine needed in bf16). It takes neither
  method nor N (megatron: "recompute_num_layers must be None").

Only the trainer's model gets these fields: the frozen reference / teacher copies run no backward.

Optimizer offload (`OptimizerConfig`, optimizer_config.py:344-362, 430-466; optimizer/__init__.py:500-541):
``--optimizer-cpu-offload`` builds megatron's `HybridDeviceOptimizer` with
``optimizer_offload_fraction=1.0`` (megatron's default 0.0 offloads nothing): every fp32 master
weight, Adam moment and the update itself live on the CPU (torch AdamW, fused CPU kernel);
gradients go device -> host and updated bf16 weights host -> device each step.
``--overlap-cpu-optimizer-d2h-h2d`` does those copies on side streams, one CPU optimizer per
parameter. Megatron-LM requires ``--use-precision-aware-optimizer`` with the offload (its
arguments.py: "the hybrid device optimizer reuses the code path of this flag"), which requires the
distributed optimizer (optimizer_config.py:434); without the offload it runs on Transformer Engine's
FusedAdam (optimizer_config.py:441-466), refused when transformer_engine is not importable.
"""

from __future__ import annotations

from typing import Any

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.megatron_config import MegatronConfig
from relax.utils.flag_types import ConfigError

RECOMPUTE_FLAGS = ("recompute_granularity", "recompute_method", "recompute_num_layers")
OPTIMIZER_OFFLOAD_FLAGS = ("optimizer_cpu_offload", "overlap_cpu_optimizer_d2h_h2d", "use_precision_aware_optimizer")
MEMORY_FLAGS = RECOMPUTE_FLAGS + OPTIMIZER_OFFLOAD_FLAGS
SELECTIVE_RECOMPUTE_MODULES = ("core_attn",)  # megatron-core's default for --recompute-granularity selective


def te_available() -> bool:
    """Whether Transformer Engine imports here (megatron-core's precision-aware optimizer needs its FusedAdam)."""
    return module_available("transformer_engine")


def mcore_runs_precision_aware_without_te() -> bool:
    """Whether the installed megatron-core builds a precision-aware `OptimizerConfig` without Transformer Engine.

    Its ``__post_init__`` calls ``is_te_min_version("2.1.0")`` for the precision-aware optimizer
    (optimizer_config.py:438 in 0.19.2). Without TE, 0.19.2's ``get_te_version()`` returns 0.0.0
    (utils.py:321-322); older releases (0.16.1 checked) return None and the comparison raises TypeError.
    Imports megatron-core: call it where the backend is built, not at flag parsing.
    """
    from megatron.core.utils import get_te_version

    try:
        return get_te_version() is not None
    except Exception:  # noqa: BLE001 - any failure here is the same failure OptimizerConfig would hit
        return False


def _mcore_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("megatron-core")
    except importlib.metadata.PackageNotFoundError:
        return "(not installed)"


def memory_flags_given(cfg: MegatronConfig) -> list[str]:
    """Dests of the recompute / optimizer-offload flags set to something other than their default (off)."""
    return [dest for dest in MEMORY_FLAGS if getattr(cfg, dest) not in (None, False)]


def recompute_kwargs(cfg: MegatronConfig, num_layers: int | None = None) -> dict[str, Any]:
    """`TransformerConfig` fields for the trainer's model; ``{}`` without ``--recompute-granularity``.

    ``num_layers``: the model's layer count; a larger ``--recompute-num-layers`` is refused
    (megatron: "between 1 and num_layers_per_pipeline_rank").
    """
    granularity = cfg.recompute_granularity
    if granularity is None:
        return {}
    if granularity == "selective":
        return {"recompute_granularity": "selective", "recompute_modules": list(SELECTIVE_RECOMPUTE_MODULES)}
    if granularity != "full":
        raise ConfigError(f"--recompute-granularity {granularity!r}: choose full or selective")
    method, layers = cfg.recompute_method, cfg.recompute_num_layers
    if method is None or layers is None:
        raise ConfigError("--recompute-granularity full needs --recompute-method (uniform or block) and "
                          "--recompute-num-layers N")
    if num_layers is not None and not 1 <= layers <= num_layers:
        raise ConfigError(f"--recompute-num-layers {layers}: must be between 1 and the model's {num_layers} layers")
    return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": int(layers),
            "distribute_saved_activations": False}


def optimizer_offload_kwargs(cfg: MegatronConfig) -> dict[str, Any]:
    """`OptimizerConfig` fields for the optimizer offload flags; ``{}`` when none is given."""
    out: dict[str, Any] = {}
    if cfg.use_precision_aware_optimizer:
        if not cfg.use_distributed_optimizer:
            raise ConfigError("--use-precision-aware-optimizer needs --use-distributed-optimizer "
                              "(megatron-core's OptimizerConfig)")
        if not cfg.optimizer_cpu_offload and not te_available():
            raise ConfigError("not supported yet: --use-precision-aware-optimizer without --optimizer-cpu-offload "
                              "(megatron-core runs it on Transformer Engine's FusedAdam; transformer_engine is "
                              "not installed)")
        if not te_available() and not mcore_runs_precision_aware_without_te():
            raise ConfigError(f"not supported yet: --use-precision-aware-optimizer with megatron-core "
                              f"{_mcore_version()} and no Transformer Engine (its OptimizerConfig compares a "
                              "missing TE version; megatron-core 0.19 handles it)")
        out["use_precision_aware_optimizer"] = True
    if cfg.optimizer_cpu_offload:
        if not cfg.use_precision_aware_optimizer:
            raise ConfigError("--optimizer-cpu-offload needs --use-precision-aware-optimizer (Megatron-LM's rule: "
                              "the hybrid device optimizer runs on that code path)")
        out.update(optimizer_cpu_offload=True, optimizer_offload_fraction=1.0,
                   overlap_cpu_optimizer_d2h_h2d=bool(cfg.overlap_cpu_optimizer_d2h_h2d))
    elif cfg.overlap_cpu_optimizer_d2h_h2d:
        raise ConfigError("--overlap-cpu-optimizer-d2h-h2d has no effect without --optimizer-cpu-offload")
    return out


def make_embedding_output_differentiable(gpt: Any) -> Any | None:
    """With full recompute and a frozen embedding, mark the embedding output as requiring grad.

    Megatron's full recompute wraps layers in a reentrant ``torch.autograd.Function``
    (``tensor_parallel.CheckpointFunction``): its output requires grad only if one of its tensor
    inputs does. With ``--freeze-params-name-list embedding`` (or an ``--only-train-params-name-list``
    that leaves it out) the decoder's input does not, so every checkpointed layer would silently get
    no gradient. A forward hook on the embedding returns a detached copy that requires grad (what
    HF's ``enable_input_require_grads`` does): values and weight gradients are unchanged. Returns
    the hook handle, or None when the embedding trains anyway.
    """
    import torch

    embedding = getattr(gpt, "embedding", None)  # a later pipeline stage has none: its input carries the grad
    if embedding is None or all(p.requires_grad for p in embedding.parameters()):
        return None

    def _require_grad(module, inputs, output):
        if torch.is_grad_enabled() and isinstance(output, torch.Tensor) and not output.requires_grad:
            return output.detach().requires_grad_(True)
        return None

    return gpt.embedding.register_forward_hook(_require_grad)
