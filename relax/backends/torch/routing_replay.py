"""Routing replay in the torch trainer: the policy's forwards take recorded MoE expert choices.

* ``--use-rollout-routing-replay`` (R3): each sample's routing comes from the engine that generated it
  (``Sample.rollout_routed_experts``, SGLang's ``meta_info["routed_experts"]``), and every policy forward
  replays it: the old-log-prob pass and the update's forwards.
* ``--use-routing-replay`` alone: the old-log-prob pass (the policy before the update) routes freely and
  is recorded; the update's forwards replay it, so every PPO epoch and micro-batch sees the old routing.
  When the update's own forward stands in for that pass (``train/old_log_probs_from_step`` 1), it is the
  one forward per row and there is nothing to replay.

A row's routing covers positions ``0 .. len(tokens) - 2`` (every token that predicts a response token or
feeds the KV they attend to, the prompt included); the last token predicts nothing and routes freely.
Only the policy model replays; the reference, teacher and critic route on their own.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch

from relax.backends.torch.batch import ModelInputs, TrainSample
from relax.models import moe_routing


class RoutingRows:
    """Each row's routing for one rollout batch (``rows[i]``: ``[len(tokens) - 1, layers, top_k]`` or None) and
    the step's replay counts; what a backend's forwards replay or fill. Shared by the torch and Megatron backends
    (relax/backends/megatron/routing_replay.py), whose forwards differ."""

    def __init__(self, layers: int, top_k: int, *, from_rollout: bool):
        self.layers, self.top_k = layers, top_k
        self.from_rollout = from_rollout
        self.rows: list[np.ndarray | None] = []
        self.tokens = 0  # router rows forced this step
        self.changed = 0  # (row, layer) pairs forced away from the router's own top-k this step
        self.pairs = 0  # (row, layer) pairs forced this step, over the MoE layers

    def begin(self, samples: list[TrainSample]) -> None:
        self.tokens = self.changed = self.pairs = 0
        if not self.from_rollout:
            self.rows = [None] * len(samples)
            return
        self.rows = []
        for i, s in enumerate(samples):
            if s.routed_experts is None:
                raise ValueError(f"--use-rollout-routing-replay: sample {i} came without routed experts (the engine "
                                 "answered no meta_info.routed_experts; SGLang needs "
                                 "--sglang-enable-return-routed-experts)")
            rows = moe_routing.decode(s.routed_experts, self.layers, self.top_k)
            if rows.shape[0] != len(s.tokens) - 1:
                raise ValueError(f"--use-rollout-routing-replay: sample {i} has {rows.shape[0]} routed rows for "
                                 f"{len(s.tokens)} tokens (want one per token but the last)")
            self.rows.append(rows)

    def metrics(self) -> dict[str, float]:
        return {"train/routing_replay_tokens": float(self.tokens),
                "train/routing_replay_changed_frac": self.changed / self.pairs if self.pairs else 0.0}


class RoutingReplay(RoutingRows):
    """The torch trainer's: forward hooks on the HF model's routers (relax/models/moe_routing.py).
    ``sum_rows``: `DataParallel.sum_rows`, which `share` sends the recorded rows through."""

    def __init__(self, model: torch.nn.Module, *, from_rollout: bool, sum_rows):
        if not moe_routing.moe_routers(model):
            raise ValueError(f"--use-routing-replay needs a MoE model; {type(model).__name__} has no MoE router")
        self.model = model
        self.sum_rows = sum_rows
        self.moe_layers = len(moe_routing.moe_routers(model))
        super().__init__(*moe_routing.routing_shape(model.config), from_rollout=from_rollout)

    @contextmanager
    def forward(self, model: torch.nn.Module, sl: slice, inputs: ModelInputs) -> Iterator[None]:
        """Around one micro-batch forward of rows ``sl``: replay where every row has a routing, else record."""
        rows = self.rows[sl]
        if model is not self.model or not rows:
            yield
            return
        b, width = inputs.input_ids.shape
        if all(r is not None for r in rows):
            experts = torch.zeros(b, width, self.layers, self.top_k, dtype=torch.int32)
            mask = torch.zeros(b, width, dtype=torch.bool)
            for i, r in enumerate(rows):
                experts[i, :len(r)] = torch.from_numpy(r)
                mask[i, :len(r)] = True
            with moe_routing.replay(model, experts.view(b * width, self.layers, self.top_k), mask.view(-1)) as st:
                yield
            self.tokens += st.tokens
            self.pairs += st.tokens * self.moe_layers
            self.changed += st.changed
            return
        if self.from_rollout:
            raise RuntimeError("routing replay: a row without its rollout routing")
        with moe_routing.record(model) as rec:
            yield
        grid = rec.forwards[0].view(b, width, self.layers, self.top_k).cpu().numpy()
        lengths = inputs.attention_mask.sum(-1).tolist()
        for i, n in enumerate(lengths):
            if self.rows[sl.start + i] is None:
                self.rows[sl.start + i] = grid[i, :int(n) - 1].copy()

    def share(self) -> None:
        """After the old-log-prob pass: every data-parallel rank gets the rows the others recorded
        (ids travel as id + 1 over zeros)."""
        if self.from_rollout or not self.rows:
            return
        width = max((len(r) for r in self.rows if r is not None), default=0)
        packed = torch.zeros(len(self.rows), width + 1, self.layers, self.top_k, dtype=torch.int32)
        for i, r in enumerate(self.rows):
            if r is not None:
                packed[i, 0] = 1  # row i is recorded here, with len(r) positions
                packed[i, 1:len(r) + 1] = torch.from_numpy(r) + 1
        packed = self.sum_rows(packed)
        for i in range(len(self.rows)):
            if self.rows[i] is None and int(packed[i, 0, 0, 0]):
                filled = (packed[i, 1:] > 0).all(-1).all(-1)
                self.rows[i] = (packed[i, 1:1 + int(filled.sum())] - 1).numpy()
