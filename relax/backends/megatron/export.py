"""Weights leave the trainer as full HF tensors, gathered from the TP / PP / EP shards bucket by bucket.

Every rank of the trainer group iterates `HFExporter.buckets` together (the weight sync runs it on
rank 0 and, through the trainer actor, on every peer; ``--save-hf`` and checksums the same way).
For each bucket, in the catalogue's order:

1. the ranks of one *export replica* of each parameter (data-parallel rank 0, or expert-data-parallel
   rank 0 for experts; its pipeline stage, its expert-parallel rank) all-gather their pieces over
   their tensor-parallel group (expert-tensor-parallel for experts) and join them (`unshard`);
2. that replica's TP rank 0 sends the full megatron tensor to global rank 0 (point to point), unless
   it is rank 0;
3. rank 0 turns the bucket's tensors into HF names and tensors (`separate`: qkv and gate/up split,
   tied lm_head listed) and yields them; every other rank yields an empty list for the same bucket.

So at most one bucket of full tensors exists at a time: on rank 0 and, in transit, on the senders.
Bucket boundaries come from the full tensors' sizes, which every rank learns once (an all-gather of
shapes when the exporter is built), so all ranks agree on them without talking per bucket. Every
rank issues its collectives in the same global order, so none waits on a peer that waits on it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.distributed as dist

from relax.backends.megatron.layout import Param, Split, separate
from relax.backends.megatron.model import BuiltModel
from relax.backends.megatron.sharding import RankPos, owner_ep_rank, owner_stage, unshard
from relax.backends.megatron.weights import ShardPlan
from relax.observability.collective_memory import checked

Bucket = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class _Member:
    """What every rank tells the others once: its grid position and which export replicas it belongs to."""

    rank: int
    pos: RankPos
    dense_replica0: bool  # data-parallel (with context-parallel) rank 0
    expert_replica0: bool  # expert-data-parallel rank 0


def _full_shape(param: Param, local: torch.Tensor, size: int, vocab: int) -> tuple[int, ...]:
    shape = list(local.shape)
    if param.split is Split.ROW:
        shape[1] *= size
    elif param.split is Split.VOCAB:
        shape[0] = vocab
    elif param.split is not Split.REPLICATED:
        shape[0] *= size
    return tuple(shape)


class HFExporter:
    """Gathers this model's full HF tensors onto global rank 0 (see the module docstring). Build on every rank."""

    def __init__(self, built: BuiltModel, plan: ShardPlan):
        from megatron.core import parallel_state as ps

        self.built, self.plan = built, plan
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world = dist.get_world_size() if dist.is_initialized() else 1
        self._groups = {False: ps.get_tensor_model_parallel_group(), True: ps.get_expert_tensor_parallel_group()}
        me = _Member(self.rank, plan.pos, ps.get_data_parallel_rank(with_context_parallel=True) == 0,
                     ps.get_expert_data_parallel_rank() == 0)
        self._params = [p for p in plan.params if not p.load_only]
        self._mine = {p.name: local for p, local in plan.mine() if not p.load_only}
        shapes = self._my_shapes(me)
        members, tables = self._all_gather([me, shapes])
        self.shapes: dict[str, tuple[tuple[int, ...], torch.dtype]] = {k: v for t in tables for k, v in t.items()}
        self.sender = {p.name: self._sender(p, members) for p in self._params}
        self.me = me

    def _all_gather(self, obj) -> tuple[list, list]:
        if self.world == 1:
            return [obj[0]], [obj[1]]
        out: list = [None] * self.world
        with checked("all_gather_object(export shapes)"):
            dist.all_gather_object(out, obj)
        return [o[0] for o in out], [o[1] for o in out]

    def _exports(self, param: Param, member: _Member) -> bool:
        """Whether ``member`` is in the export replica of ``param`` (and holds it)."""
        wl, par = self.plan.wl, self.plan.par
        if member.pos.pp != owner_stage(param, wl.num_layers, par.pp):
            return False
        if param.is_expert:
            return member.expert_replica0 and member.pos.ep == owner_ep_rank(param, wl.num_experts, par.ep)
        return member.dense_replica0

    def _my_shapes(self, me: _Member) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        state = self.built.gpt.state_dict()
        out = {}
        for param in self._params:
            if param.name in self._mine and self._exports(param, me) and me.pos.split_rank(param) == 0:
                local = state[self._mine[param.name]]
                size = self.plan.par.split_size(param)
                out[param.name] = (_full_shape(param, local, size, self.plan.vocab_size), local.dtype)
        return out

    def _sender(self, param: Param, members: list[_Member]) -> int:
        senders = [m.rank for m in members if self._exports(param, m) and m.pos.split_rank(param) == 0]
        if len(senders) != 1:
            raise RuntimeError(f"{param.name}: expected one rank to export it, found {senders}")
        return senders[0]

    # ------------------------------------------------------------------ buckets
    def plan_buckets(self, bucket_bytes: int) -> list[list[Param]]:
        """Parameters per bucket (every rank computes the same split); HF bytes include tied aliases."""
        buckets: list[list[Param]] = [[]]
        size = 0
        for param in self._params:
            shape, dtype = self.shapes[param.name]
            # the HF parts of qkv / gate-up add up to the full tensor; a tied lm_head is one more copy
            nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() * (1 + len(param.hf_aliases))
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append(param)
            size += nbytes
        return buckets

    def buckets(self, bucket_bytes: int) -> Iterator[Bucket]:
        """Full HF tensors on rank 0, bucket by bucket; empty lists (same count) on the other ranks."""
        for params in self.plan_buckets(bucket_bytes):
            yield self._bucket(params)

    @torch.no_grad()
    def _bucket(self, params: list[Param]) -> Bucket:
        state = self.built.gpt.state_dict()
        full: dict[str, torch.Tensor] = {}
        for param in params:
            if param.name in self._mine and self._exports(param, self.me):
                gathered = self._gather(param, state[self._mine[param.name]].detach())
                if gathered is not None:
                    full[param.name] = gathered
        out: Bucket = []
        for param in params:
            src = self.sender[param.name]
            if self.rank == 0:
                tensor = full[param.name] if src == 0 else self._recv(param, src)
                out += separate(param, tensor, self.plan.wl)
            elif src == self.rank:
                with checked("send(export)"):
                    dist.send(full[param.name].contiguous(), dst=0)
        return out

    def _gather(self, param: Param, local: torch.Tensor) -> torch.Tensor | None:
        """The full megatron tensor on the piece holder of split rank 0 (None on the others)."""
        size = self.plan.par.split_size(param)
        if param.split is Split.REPLICATED or size == 1:
            return unshard(param, [local], self.plan.vocab_size) if self.me.pos.split_rank(param) == 0 else None
        pieces = [torch.empty_like(local) for _ in range(size)]
        with checked("all_gather(export)"):
            dist.all_gather(pieces, local.contiguous(), group=self._groups[param.is_expert])
        if self.me.pos.split_rank(param) != 0:
            return None
        return unshard(param, pieces, self.plan.vocab_size)

    def _recv(self, param: Param, src: int) -> torch.Tensor:
        shape, dtype = self.shapes[param.name]
        device = next(self.built.gpt.parameters()).device
        buffer = torch.empty(shape, dtype=dtype, device=device)
        with checked("recv(export)"):
            dist.recv(buffer, src=src)
        return buffer
