"""One compiled kernel each way, with the *same* forward kernel whether or not autograd records.

Why not ``torch.compile`` over the differentiable function (what norms.py and rope_fusion.py did):
AOTAutograd then compiles two different forward graphs, one for calls under ``no_grad`` and one for
calls that record a backward (which also saves what the backward needs), and inductor rounds them
differently in places. The trainer's no-grad old-log-prob pass and the training forward of the same
weights then disagreed: step-0 ``ppo_kl`` 4.6e-5 with ``--use-kl-loss`` on the H100
(tests/gpu/test_megatron_gpu.py), where the PPO ratio must be exactly 1. Here the forward is one
function compiled once, always called on detached tensors (one dynamo variant per shape, whatever
the grad mode and ``requires_grad``), from an autograd Function whose backward is a second compiled
function of the upstream gradient and the saved inputs: both passes run the same kernel, bitwise.

Off CUDA the functions run eagerly, which is how CPU tests check the backward formulas in float64.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from types import ModuleType
from typing import Any

import torch

from relax.backends.megatron.fusions import recompile_headroom


class CompiledOnCuda:
    """``fn`` compiled (``dynamic=None``: a new length recompiles once, then dynamic) on its first CUDA call;
    called as is on other devices.

    ``static_trailing``: the last that many dims of every tensor argument stay static (``mark_static``), one
    specialization per size, where dynamo would otherwise make them dynamic once a second size came. Why: one
    RMSNorm serves the hidden ``[s, b, 1024]`` and the q/k ``[s, b, heads, 64]`` rows of bench-270m; after both
    the row width turned symbolic and inductor's persistent reductions became looped ones: the q-norm took
    121 us where the hidden norm of the same bytes took 34 (H100, GRPO bench shape), ~5 ms of an RL step's
    97 ms of kernels with their backwards. The leading (token) dims stay free to vary."""

    def __init__(self, fn: Callable[..., Any], static_trailing: int = 0):
        self.fn = fn
        self.static_trailing = static_trailing
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, first: torch.Tensor, *rest: Any) -> Any:
        if not first.is_cuda:
            return self.fn(first, *rest)
        if self._compiled is None:
            recompile_headroom()
            self._compiled = torch.compile(self.fn, dynamic=None)
        if self.static_trailing:
            for t in (first, *rest):
                if isinstance(t, torch.Tensor):
                    for dim in range(max(t.dim() - self.static_trailing, 0), t.dim()):
                        torch._dynamo.mark_static(t, dim)
        return self._compiled(first, *rest)


@functools.cache
def direct_kernels() -> ModuleType | None:
    """forward_kernels.py (the RMSNorm / RoPE forwards launched directly) where Triton imports, else None; imported
    once, not on every norm call."""
    from relax.utils.modules import module_available

    if not module_available("triton"):
        return None
    from relax.backends.megatron import forward_kernels

    return forward_kernels


def records_grad(*tensors: torch.Tensor) -> bool:
    """Whether a call with these inputs builds an autograd graph (else the plain forward serves)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
