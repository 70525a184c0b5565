"""``--offload-train`` on the Megatron backend: give the GPU to the engines while they roll out.

What moves is what training alone needs, through megatron-core's own RL hooks:

- the DDP gradient buffers (fp32, ``grad_reduce_in_fp32``) are freed by
  ``DistributedDataParallel.offload_grad_buffers`` and come back zeroed (``restore_grad_buffers``): a step
  starts from zeroed gradients anyway, so nothing is lost;
- the optimizer's fp32 state (the master weights, or this rank's shards of them with the distributed
  optimizer, and Adam's two moments) goes to CPU memory by ``MegatronOptimizer.offload_to_cpu`` and back by
  ``restore_from_cpu``: copies, so training after a round trip is bitwise the same.

The bf16 weights stay on the GPU: the colocate loop syncs them to the engines right after the offload
(relax/core/offload.py), and they are 2 of the ~18 bytes a trained parameter holds (bf16 weight, fp32
gradient, fp32 master weight, two fp32 moments). A reference or old-actor copy stays as well.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import torch


def torch_optimizers(optimizer) -> Iterator[torch.optim.Optimizer]:
    """The torch optimizers inside megatron's optimizer: a ChainedOptimizer's members, each wrapper's ``optimizer``."""
    if hasattr(optimizer, "chained_optimizers"):
        for member in optimizer.chained_optimizers:
            yield from torch_optimizers(member)
    elif isinstance(optimizer, torch.optim.Optimizer):
        yield optimizer
    else:
        yield from torch_optimizers(optimizer.optimizer)


def _optimizer_tensors(optimizer) -> Iterator[torch.Tensor]:
    """The tensors ``offload_to_cpu`` moves: every torch optimizer's parameters (fp32 masters) and state."""
    for inner in torch_optimizers(optimizer):
        for group in inner.param_groups:
            yield from (p for p in group["params"] if isinstance(p, torch.Tensor))
        for state in inner.state.values():
            yield from (v for v in state.values() if isinstance(v, torch.Tensor))


class MegatronOffloader:
    """Moves one rank's gradient buffers and optimizer state off the GPU and back."""

    def __init__(self, ddp, optimizer, device: torch.device):
        self.ddp, self.optimizer, self.device = ddp, optimizer, device
        self.offloaded = False

    def offload(self) -> dict[str, float]:
        if self.offloaded:
            raise RuntimeError("relax: the Megatron trainer is offloaded already")
        t0 = time.perf_counter()
        torch.cuda.synchronize(self.device)
        before = torch.cuda.memory_allocated(self.device)
        moved = sum(t.nbytes for t in _optimizer_tensors(self.optimizer) if t.is_cuda)
        self.ddp.offload_grad_buffers(synchronize=False, empty_cache=False)
        self.optimizer.offload_to_cpu()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        self.offloaded = True
        return {"seconds": time.perf_counter() - t0, "moved_bytes": float(moved),
                "device_bytes": float(before - torch.cuda.memory_allocated(self.device))}

    def onload(self) -> dict[str, float]:
        if not self.offloaded:
            raise RuntimeError("relax: the Megatron trainer is not offloaded")
        t0 = time.perf_counter()
        before = torch.cuda.memory_allocated(self.device)
        self.ddp.restore_grad_buffers(synchronize=False)
        self.optimizer.restore_from_cpu()
        torch.cuda.synchronize(self.device)
        self.offloaded = False
        moved = sum(t.nbytes for t in _optimizer_tensors(self.optimizer) if t.is_cuda)
        return {"seconds": time.perf_counter() - t0, "moved_bytes": float(moved),
                "device_bytes": float(torch.cuda.memory_allocated(self.device) - before)}
