"""Routing replay in the Megatron backend: the policy's MoE routers take recorded expert choices.

The contract is the torch backend's (relax/backends/torch/routing_replay.py): with
``--use-rollout-routing-replay`` every policy forward replays the engine's routing; with
``--use-routing-replay`` alone the old-log-prob pass routes freely and is recorded, and the update's
forwards replay it. A row's routing covers positions ``0 .. len(tokens) - 2``; only the policy replays.

It runs through megatron-core's own mechanism (moe/router_replay.py): a TopKRouter built with
``moe_enable_routing_replay`` holds a `RouterReplay`, which under ``REPLAY_FORWARD`` takes its target indices
in place of the router's top-k and gathers the router's own scores at them
(moe_utils.topk_routing_with_score_function: the softmax over the forced experts' logits, i.e. the router's
softmax renormalised over them as Qwen3-MoE's ``norm_topk_prob`` does, or the full softmax's values with
``moe_router_pre_softmax``), so the router keeps its gradient; under ``RECORD`` it keeps its own top-k's
indices. Only the policy's config turns it on: the reference, teacher and old-actor copies build no
`RouterReplay` and route on their own. megatron-core also lists every instance in a class-level list, which
its static helpers drive all at once; the policy's instances are taken out of it, so that this object alone
drives them and another backend in the process never sees them.

Per micro-batch (`forward`, around the stage's forward in schedule.StageRunner): the rows' routing, laid out
as this rank's routers see the tokens (routing_layout.py), becomes each local MoE layer's target; padding and
each row's last token take experts ``0 .. top_k - 1`` (they carry no loss, and causal attention keeps them out
of the real tokens). The backward replays nothing, the forced indices being in the autograd graph, unless
``--recompute-granularity full`` runs the layers' forward again there: then each router is left in
megatron-core's ``REPLAY_BACKWARD``, whose recomputed forward takes the targets this micro-batch set, first in
first out (the pipeline's warm-up forwards queue theirs in the order their backwards come), and `end_update`
clears what is left after the optimizer step's schedule (layers the method does not recompute never take theirs).

Recording (the old pass): each rank writes what its routers picked, its stage's layers at its part of the
sequence, into a ``[rows, width, layers, top_k]`` grid (ids + 1 over zeros), and `share` sums the grid over
every rank, so each holds every row whole: data-parallel ranks saw different rows, pipeline stages different
layers, sequence-parallel ranks different positions (without sequence parallelism only TP rank 0 writes).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from relax.backends.megatron.routing_layout import RouterRows
from relax.backends.torch.batch import ModelInputs, TrainSample
from relax.backends.torch.data_parallel import DataParallel
from relax.backends.torch.routing_replay import RoutingRows


def replay_config() -> dict[str, bool]:
    """The policy model's `TransformerConfig` field that gives each of its routers a `RouterReplay`."""
    return {"moe_enable_routing_replay": True}


def policy_routers(gpt) -> list[tuple[int, torch.nn.Module]]:
    """``(global layer index, TopKRouter)`` of this pipeline stage's MoE layers, their `RouterReplay` instances
    taken out of megatron-core's class-level list (module docstring)."""
    from megatron.core.transformer.moe.router_replay import RouterReplay

    routers = [(layer.layer_number - 1, layer.mlp.router) for layer in gpt.decoder.layers
               if getattr(layer.mlp, "router", None) is not None]
    if not routers:
        raise ValueError("--use-routing-replay needs a MoE model; this GPTModel stage has no MoE router")
    mine = {id(router.router_replay) for _, router in routers}
    if None in {router.router_replay for _, router in routers}:
        raise ValueError("routing replay: the policy was built without moe_enable_routing_replay")
    RouterReplay.global_router_replay_instances[:] = [
        r for r in RouterReplay.global_router_replay_instances if id(r) not in mine]
    return routers


class MegatronRoutingReplay(RoutingRows):
    """The policy's routers on this rank, and each row's routing for one rollout batch."""

    def __init__(self, gpt, routing_shape: tuple[int, int], *, from_rollout: bool, sequence_shards: int,
                 recomputes: bool = False):
        from megatron.core import parallel_state as ps

        super().__init__(*routing_shape, from_rollout=from_rollout)
        self.routers = policy_routers(gpt)
        for layer, router in self.routers:
            if layer >= self.layers or router.topk != self.top_k:
                raise ValueError(f"routing replay: router of layer {layer} (top-{router.topk}) does not fit the "
                                 f"HF config's {self.layers} layers x top-{self.top_k}")
        tp_rank = ps.get_tensor_model_parallel_rank()
        self.shards = sequence_shards  # the TP size with --sequence-parallel, else 1
        self.shard = tp_rank if sequence_shards > 1 else 0
        self.writes = sequence_shards > 1 or tp_rank == 0  # whether this rank's recording goes into the grid
        self.counts_tokens = tp_rank == 0 and ps.is_pipeline_first_stage()  # one rank per data-parallel replica
        self.world = DataParallel.current()  # `share` and `metrics` sum over every rank
        self.recomputes = recomputes  # --recompute-granularity full: the backward runs the routers again
        self._grid: torch.Tensor | None = None  # the old pass's recording, between `begin` and `share`
        self._seen: torch.Tensor | None = None  # rows recorded
        self._lengths: list[int] = []  # routed positions per row (len(tokens) - 1)
        self._changed: list[torch.Tensor] = []  # per replayed forward and layer, rows forced off their top-k

    def begin(self, samples: list[TrainSample]) -> None:
        super().begin(samples)
        self._changed = []
        self._lengths = [len(s.tokens) - 1 for s in samples]
        if not self.from_rollout:
            width = max(self._lengths, default=0)
            self._grid = torch.zeros(len(samples), width, self.layers, self.top_k, dtype=torch.int32)
            self._seen = torch.zeros(len(samples), dtype=torch.int32)

    @contextmanager
    def forward(self, sl: slice, inputs: ModelInputs) -> Iterator[None]:
        """Around this stage's forward of rows ``sl``: replay where every row has a routing, else record (the
        old pass), else (the update's forward standing in for the old pass; a forward outside a rollout step)
        route freely."""
        rows = self.rows[sl]
        b, width = inputs.input_ids.shape
        layout = RouterRows.of(b, width, self.shard, self.shards)
        if not rows:
            yield
        elif all(r is not None for r in rows):
            with self._replaying(rows, layout):
                yield
        elif self.from_rollout:
            raise RuntimeError("routing replay: a row without its rollout routing")
        elif self._grid is not None:
            with self._recording(sl, layout):
                yield
        else:
            yield

    @contextmanager
    def _replaying(self, rows: list[np.ndarray], layout: RouterRows) -> Iterator[None]:
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        experts = torch.arange(self.top_k).expand(layout.batch, layout.length, self.layers, self.top_k).clone()
        real = torch.zeros(layout.batch, layout.length, dtype=torch.bool)
        for i, r in enumerate(rows):
            experts[i, :len(r)] = torch.from_numpy(r)
            real[i, :len(r)] = True
        device = self.routers[0][1].weight.device
        experts, local_real = experts.to(device), layout.to_router(real)
        backward = self.recomputes and torch.is_grad_enabled()  # a backward will run these routers again
        handles = []
        for layer, router in self.routers:
            router.router_replay.set_target_indices(layout.to_router(experts[:, :, layer]))
            router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_FORWARD)
            handles.append(router.register_forward_hook(self._count_changed(local_real.to(device))))
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            if backward:  # the recomputed forward pops this micro-batch's targets (megatron's backward list)
                for _, router in self.routers:
                    router.router_replay.set_router_replay_action(RouterReplayAction.REPLAY_BACKWARD)
            else:
                self._release()
        self.tokens += int(real.sum())
        self.pairs += int(local_real.sum()) * len(self.routers)

    def _count_changed(self, real: torch.Tensor):
        """A forward hook counting the real rows whose forced experts differ from the router's own top-k."""
        def hook(router, inputs, output):
            with torch.no_grad():
                logits = router.gating(inputs[0]).reshape(-1, router.config.num_moe_experts)
                own = torch.zeros_like(output[1]).scatter(1, logits.topk(router.topk, dim=-1).indices, True)
                self._changed.append(((own != output[1]).any(-1) & real).sum())
        return hook

    @contextmanager
    def _recording(self, sl: slice, layout: RouterRows) -> Iterator[None]:
        from megatron.core.transformer.moe.router_replay import RouterReplayAction

        for _, router in self.routers:
            router.router_replay.set_router_replay_action(RouterReplayAction.RECORD)
        try:
            yield
            if self.writes:
                self._write(sl, layout)
        finally:
            self._release()
        self._seen[sl] = 1

    def _write(self, sl: slice, layout: RouterRows) -> None:
        """This rank's routers' picks for rows ``sl`` into the grid: its layers at its positions, real rows only."""
        pos = layout.positions
        stop = min(pos.stop, self._grid.shape[1])
        if stop <= pos.start:
            return
        routed = torch.tensor(self._lengths[sl])[:, None] > torch.arange(pos.start, stop)[None, :]  # [b, s]
        for layer, router in self.routers:
            picked = layout.from_router(router.router_replay.get_recorded_indices())[:, :stop - pos.start]
            ids = (picked.to("cpu", torch.int32) + 1) * routed[..., None]
            self._grid[sl, pos.start:stop, layer] = ids

    def end_update(self) -> None:
        """After an optimizer step's schedule: nothing of it may reach the next forward (module docstring)."""
        self._release()

    def _release(self) -> None:
        for _, router in self.routers:
            router.router_replay.clear_indices()  # the targets, the recording and the backward list megatron keeps
            router.router_replay.clear_router_replay_action()

    def share(self) -> None:
        """After the old-log-prob pass: every rank gets every row's recorded routing (module docstring)."""
        if self._grid is None:
            return
        grid, seen = self._grid, self._seen
        self._grid = self._seen = None
        seen = self.world.sum_rows(seen)
        if not int(seen.sum()):  # the update's forward stood in for the old pass: nothing recorded
            return
        grid = self.world.sum_rows(grid)
        for i, n in enumerate(self._lengths):
            if seen[i]:
                self.rows[i] = (grid[i, :n] - 1).clamp(min=0).numpy()  # a dense layer's ids stay 0, as SGLang's

    def metrics(self) -> dict[str, float]:
        """The torch backend's keys, summed over the ranks (tokens once per data-parallel replica)."""
        changed = sum(int(c) for c in self._changed)
        totals = torch.tensor([self.tokens if self.counts_tokens else 0, changed, self.pairs], dtype=torch.float64)
        self.tokens, self.changed, self.pairs = (int(v) for v in self.world.sum_rows(totals).tolist())
        self._changed = []
        return super().metrics()
