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

from collections.abc import Callable
from typing import Any

import torch

from relax.backends.megatron.fusions import recompile_headroom


class CompiledOnCuda:
    """``fn`` compiled (``dynamic=None``: a new length recompiles once, then dynamic) on its first CUDA call;
    called as is on other devices."""

    def __init__(self, fn: Callable[..., Any]):
        self.fn = fn
        self._compiled: Callable[..., Any] | None = None

    def __call__(self, first: torch.Tensor, *rest: Any) -> Any:
        if not first.is_cuda:
            return self.fn(first, *rest)
        if self._compiled is None:
            recompile_headroom()
            self._compiled = torch.compile(self.fn, dynamic=None)
        return self._compiled(first, *rest)


def records_grad(*tensors: torch.Tensor) -> bool:
    """Whether a call with these inputs builds an autograd graph (else the plain forward serves)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
