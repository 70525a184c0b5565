"""Data parallelism for the torch backend: which micro-batches a rank trains, and the collectives.

Every rank of the trainer group (``--resource '{"actor": [N, ...]}'``, relax/distributed/trainer_group.py)
receives the whole rollout batch and cuts it into exactly the micro-batches a single trainer would;
rank ``r`` of ``N`` then runs micro-batches ``r, r + N, r + 2N, ...`` of each optimizer step. The
loss of every micro-batch is already divided by the step's global sample (or token) count
(relax/algorithms/reducers.py), so summing the ranks' gradients gives the single-trainer gradient:
the same terms, only added in another order. That is why the DP size leaves the loss and the
update unchanged up to float rounding (tests/test_data_parallel.py, scenario parity-dp2-cpu).

The weights stay replicated: every rank clips and steps the same reduced gradients, so rank 0
alone serves weight syncs and writes checkpoints. Log-probs and critic values are computed for a
rank's own rows and summed over the group (the other rows are zeros, so the sum is exact).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from relax.algorithms.reducers import merge_metrics
from relax.observability.collective_memory import checked

# Gradients are all-reduced in flat buckets of at most this many bytes (one copy each, not the whole model).
GRAD_BUCKET_BYTES = 64 * 1024 * 1024


@dataclass(frozen=True)
class DataParallel:
    rank: int = 0
    size: int = 1
    group: Any = None  # the process group of the data-parallel ranks (None: the default group, every rank)

    @classmethod
    def current(cls) -> DataParallel:
        """The default process group's rank and size (a world of one when there is none)."""
        if not dist.is_available() or not dist.is_initialized():
            return cls()
        return cls(dist.get_rank(), dist.get_world_size())

    def mine(self, micro_batches: list[slice], costs: list[float] | None = None) -> list[slice]:
        """This rank's share of one optimizer step's micro-batches: round robin, or with ``costs``
        (``--balance-data``) the rank's subset of a Karmarkar-Karp split of those costs (balance.py)."""
        if costs is None or self.size == 1:
            return micro_batches[self.rank::self.size]
        from relax.backends.torch.balance import karmarkar_karp

        return [micro_batches[i] for i in karmarkar_karp(costs, self.size)[self.rank]]

    def sum_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        """All-reduce (sum) a per-row tensor that holds this rank's rows and zeros elsewhere, in place.

        The log-prob and value columns live on the host; NCCL (GPU runs) reduces device tensors only,
        so there they make a round trip through the GPU.
        """
        if self.size == 1:
            return tensor
        if tensor.device.type == "cpu" and dist.get_backend(self.group) == "nccl":
            on_device = tensor.to(torch.device("cuda", torch.cuda.current_device()))
            with checked("all_reduce(rows)"):
                dist.all_reduce(on_device, group=self.group)
            tensor.copy_(on_device)
        else:
            with checked("all_reduce(rows)"):
                dist.all_reduce(tensor, group=self.group)
        return tensor

    def reduce_gradients(self, params: Iterable[torch.nn.Parameter]) -> None:
        """Sum the gradients of ``params`` over the group; a rank that ran no micro-batch adds zeros."""
        if self.size == 1:
            return
        params = list(params)
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        bucket: list[torch.Tensor] = []
        nbytes = 0
        for p in params:
            bucket.append(p.grad)
            nbytes += p.grad.numel() * p.grad.element_size()
            if nbytes >= GRAD_BUCKET_BYTES:
                _all_reduce_flat(bucket)
                bucket, nbytes = [], 0
        if bucket:
            _all_reduce_flat(bucket)

    def merge_metrics(self, sums: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Merge every rank's micro-batch metric sums (`merge_metrics`: sums, maxima, minima), in rank order."""
        if self.size == 1:
            return sums
        gathered: list[dict[str, torch.Tensor] | None] = [None] * self.size
        with checked("all_gather_object(metrics)"):
            dist.all_gather_object(gathered, {k: v.cpu() for k, v in sums.items()}, group=self.group)
        out: dict[str, torch.Tensor] = {}
        for part in gathered:
            out = merge_metrics(out, part or {})
        return out


def _all_reduce_flat(grads: list[torch.Tensor]) -> None:
    flat = torch._utils._flatten_dense_tensors(grads)
    with checked("all_reduce(gradients)"):
        dist.all_reduce(flat)
    for grad, reduced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads), strict=True):
        grad.copy_(reduced)
