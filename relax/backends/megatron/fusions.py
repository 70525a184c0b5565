"""Kernel fusions megatron-core runs without Transformer Engine or Apex: on unless a flag turns them off.

Why: a profile of one RL step on bench-1b (H100, `ci/bench_megatron.py --profile 30`) spends ~40% of
GPU time in matmuls and most of the rest in small element-wise kernels (SwiGLU's chunk / silu / mul,
residual adds, RoPE, the optimizer's per-tensor-list kernels). Four fusions need nothing but torch:

- ``bias_activation_fusion`` (off with ``--no-bias-swiglu-fusion``, Megatron-LM's flag): the MLP's
  SwiGLU runs megatron's `bias_swiglu_impl`, whose forward and backward are compiled by its
  ``jit_fuser`` (``torch.compile`` since torch 2.2): one kernel each instead of chunk + silu + mul.
- ``bias_dropout_fusion`` (off with ``--no-bias-dropout-fusion``): the residual bias-dropout-add,
  compiled the same way.
- ``apply_rope_fusion`` (off with ``--no-rope-fusion``, Megatron-LM's flag): RoPE as one compiled kernel
  forward and one backward instead of six each per query / key tensor (rope_fusion.py fills megatron's
  fused-RoPE slot, Transformer Engine's when TE is installed).
- Adam: without Transformer Engine or Apex megatron-core builds ``torch.optim.Adam``/``AdamW``
  without ``fused``, i.e. torch's foreach kernels; `use_fused_torch_adam` switches its parameter
  groups to torch's fused CUDA kernel (the same update, one kernel per step and dtype group).

``torch.compile`` on CUDA generates Triton kernels, so the three megatron fusions need triton
importable (checked when the model is built, with the flags that turn them off in the message).
The first steps pay the compile (seconds); a new sequence length may recompile once, after which
torch marks the shapes dynamic.

Past dynamo's recompile limit (8 variants of one function by default) a compiled function silently
runs eagerly for new variants, and eager bf16 rounding differs from the fused kernel's: the no-grad
old-log-prob pass and the training forward then disagree (a step-0 PPO ratio != 1; seen on the H100 with
one compiled RMSNorm serving hidden and head shapes, frozen and trainable weights, both grad modes).
relax's norms and RoPE now see few variants (compiled_function.py), but megatron's own compiled
SwiGLU and bias-dropout-add still meet every shape and grad mode of the policy, reference and teacher
passes, so the trainer raises the limit to `RECOMPILE_LIMIT` (`recompile_headroom`) before building
its models.
"""

from __future__ import annotations

from typing import Any

import torch

from relax.backends.megatron.checks import module_available
from relax.backends.megatron.megatron_config import MegatronConfig
from relax.utils.flag_types import ConfigError

RECOMPILE_LIMIT = 64


def recompile_headroom() -> None:
    """Raise dynamo's per-function recompile limit to at least `RECOMPILE_LIMIT` (module docstring)."""
    import torch._dynamo

    config = torch._dynamo.config
    config.recompile_limit = max(config.recompile_limit, RECOMPILE_LIMIT)


def fusion_kwargs(cfg: MegatronConfig) -> dict[str, Any]:
    """`TransformerConfig` fields for every model the backend builds (trainer, reference, teacher)."""
    kwargs = {"bias_activation_fusion": not cfg.no_bias_swiglu_fusion,
              "bias_dropout_fusion": not cfg.no_bias_dropout_fusion,
              "apply_rope_fusion": not cfg.no_rope_fusion}
    if any(kwargs.values()) and not module_available("triton"):
        raise ConfigError("the Megatron SwiGLU / bias-dropout-add / RoPE fusions are compiled by torch.compile, which "
                          "needs triton (not importable): pass --no-bias-swiglu-fusion --no-bias-dropout-fusion "
                          "--no-rope-fusion")
    return kwargs


def use_fused_torch_adam(optimizer: Any) -> int:
    """Switch megatron's torch Adam/AdamW (its fallback without TE/Apex) to torch's fused CUDA kernel.

    ``optimizer``: what `get_megatron_optimizer` returned (a `ChainedOptimizer` or one megatron
    optimizer, each holding a torch optimizer as ``.optimizer``). Only plain torch Adam/AdamW whose
    parameters are all floating-point CUDA tensors is switched (not the CPU-offload optimizer, not
    TE's or Apex's FusedAdam, which are fused already). Returns how many torch optimizers it switched.
    """
    switched = 0
    for megatron_opt in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(megatron_opt, "optimizer", None)
        if type(inner) not in (torch.optim.Adam, torch.optim.AdamW):
            continue
        params = [p for group in inner.param_groups for p in group["params"]]
        if not params or not all(p.is_cuda and p.is_floating_point() for p in params):
            continue
        for group in inner.param_groups:
            if group.get("differentiable"):
                break
            group["fused"], group["foreach"] = True, False
        else:
            switched += 1
    return switched
