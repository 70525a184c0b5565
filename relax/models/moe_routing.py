"""MoE routing: record which experts the router picks, and replay recorded picks (routing replay, R3).

Routing Replay forces a MoE router's top-k selection to experts recorded earlier, keeping the router's
own softmax weights for the forced experts (R3: "Rollout Routing Replay", Ma et al. 2025, replays the
inference engine's routing in training so train and inference take the same expert paths).

The layout is SGLang 0.5.14's ``meta_info["routed_experts"]`` (``sglang/srt/state_capturer``): per token
fed to the model, ``[num_hidden_layers, num_experts_per_tok]`` int32 expert ids (a dense layer's row is
zeros); a sequence of ``n`` tokens has ``n - 1`` rows (the last token is never fed), from
``routed_experts_start_len`` on. On the wire: base64 of the raw int32 bytes (`encode` / `decode`).

The routers are transformers' ``*TopKRouter`` modules (Qwen3-MoE, Qwen2-MoE in transformers 5): a
``forward(hidden [rows, H]) -> (router_logits, scores, indices)``. `record` and `replay` hold forward
hooks for the duration of a ``with`` block and remove them on exit; nothing stays patched.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np
import torch

__all__ = ["Recorder", "decode", "encode", "moe_routers", "record", "replay", "routing_shape"]

_LAYER = re.compile(r"(?:^|\.)layers\.(\d+)\.")


def moe_routers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    """``(decoder layer index, router)`` of every MoE layer, in layer order; empty for a dense model."""
    out = []
    for name, module in model.named_modules():
        if type(module).__name__.endswith("TopKRouter") and hasattr(module, "top_k"):
            match = _LAYER.search(name)
            if match is None:
                raise ValueError(f"MoE router {name!r} is not inside a numbered decoder layer")
            out.append((int(match.group(1)), module))
    return sorted(out, key=lambda item: item[0])


def routing_shape(config) -> tuple[int, int]:
    """``(num_hidden_layers, num_experts_per_tok)``: one token's row, as SGLang sizes it."""
    return int(config.num_hidden_layers), int(config.num_experts_per_tok)


def encode(experts: np.ndarray) -> str:
    """SGLang's wire form: base64 of the int32 array's bytes."""
    return base64.b64encode(np.ascontiguousarray(experts, dtype=np.int32).tobytes()).decode("ascii")


def decode(data: str, layers: int, top_k: int) -> np.ndarray:
    """``[rows, layers, top_k]`` int32 from SGLang's base64 ``routed_experts``."""
    flat = np.frombuffer(base64.b64decode(data), dtype=np.int32)
    if flat.size % (layers * top_k):
        raise ValueError(f"routed_experts holds {flat.size} ids, not a multiple of {layers} layers x top-{top_k}")
    return flat.reshape(-1, layers, top_k).copy()  # writable (frombuffer's view is not)


@dataclass
class Recorder:
    """What `record` saw: per forward, ``[rows, layers, top_k]`` int32 (rows as the routers saw them)."""

    layers: int
    top_k: int
    forwards: list[torch.Tensor] = field(default_factory=list)
    _pending: dict[int, torch.Tensor] = field(default_factory=dict)

    def _add(self, layer: int, indices: torch.Tensor, last_layer: int) -> None:
        self._pending[layer] = indices.detach().to(torch.int32)
        if layer == last_layer:  # a forward has passed every MoE layer
            rows = indices.shape[0]
            out = torch.zeros(rows, self.layers, self.top_k, dtype=torch.int32, device=indices.device)
            for i, idx in self._pending.items():
                out[:, i] = idx
            self.forwards.append(out)
            self._pending = {}


@contextmanager
def record(model: torch.nn.Module) -> Iterator[Recorder]:
    """Record every forward's routing inside the block (`Recorder.forwards`)."""
    routers = _routers(model)
    layers, top_k = routing_shape(model.config)
    rec = Recorder(layers, top_k)
    last = routers[-1][0]

    def hook_for(layer: int):
        def hook(module, inputs, output):
            rec._add(layer, output[2], last)
        return hook

    handles = [router.register_forward_hook(hook_for(layer)) for layer, router in routers]
    try:
        yield rec
    finally:
        for h in handles:
            h.remove()


@dataclass
class ReplayStats:
    tokens: int = 0  # router rows forced to recorded experts (per forward, counted once over the layers)
    _changed: list[torch.Tensor] = field(default_factory=list)

    @property
    def changed(self) -> int:
        """(row, layer) pairs where the forced experts differ from the router's own top-k (one host sync)."""
        return int(sum(int(c) for c in self._changed))


@contextmanager
def replay(model: torch.nn.Module, experts: torch.Tensor, mask: torch.Tensor) -> Iterator[ReplayStats]:
    """Force the routers' top-k to ``experts`` ``[rows, layers, top_k]`` where ``mask`` ``[rows]`` is set.

    ``rows`` are the routers' flattened input rows (``batch * seq``, row-major). The forced experts keep
    the router's own softmax probabilities (renormalised over the top-k where the model does so), so the
    router still gets gradients; unmasked rows keep the router's own choice. One forward in the block.
    """
    routers = _routers(model)
    stats = ReplayStats(tokens=int(mask.sum()))
    cache: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}

    def forced(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        if device not in cache:
            cache[device] = (experts.to(device, torch.long), mask.to(device, torch.bool))
        return cache[device]

    def hook_for(layer: int):
        def hook(module, inputs, output):
            logits, scores, indices = output
            want, rows = forced(logits.device)
            if want.shape[0] != logits.shape[0]:
                raise ValueError(f"routing replay: {want.shape[0]} recorded rows for {logits.shape[0]} router rows "
                                 f"(layer {layer})")
            new = torch.where(rows[:, None], want[:, layer], indices)
            stats._changed.append((new.sort(-1).values != indices.sort(-1).values).any(-1).sum())
            top = torch.softmax(logits, dim=-1, dtype=torch.float).gather(-1, new)
            if getattr(module, "norm_topk_prob", False):
                top = top / top.sum(dim=-1, keepdim=True)
            new_scores = torch.where(rows[:, None], top.to(scores.dtype), scores)
            return logits, new_scores, new.to(indices.dtype)
        return hook

    handles = [router.register_forward_hook(hook_for(layer)) for layer, router in routers]
    try:
        yield stats
    finally:
        for h in handles:
            h.remove()


def _routers(model: torch.nn.Module) -> list[tuple[int, torch.nn.Module]]:
    routers = moe_routers(model)
    if not routers:
        raise ValueError(f"routing replay needs a MoE model; {type(model).__name__} has no MoE router")
    return routers
