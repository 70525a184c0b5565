"""SGLang's ``return_routed_experts`` for the embedded engine: each request's expert choices, as generated.

While a prefill or decode forward runs for a batch where a request asked for them, the MoE routers'
top-k ids are recorded (`relax.models.moe_routing.record`) and each request keeps its rows: a prefill
gives one row per prompt token, each decode step one row for the token it fed. The answer carries
SGLang 0.5.14's ``meta_info["routed_experts"]``: base64 int32 ``[seqlen - 1 - start, layers, top_k]``,
rows for positions ``[routed_experts_start_len, seqlen - 1)`` (the last generated token is never fed).

Not with CUDA-graph decode (a replayed graph runs no hooks): refused at the request.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import torch

from relax.models import moe_routing


class Routed(Protocol):
    input_ids: list[int]
    output_ids: list[int]
    routed: list[torch.Tensor] | None  # chunks of rows in position order; None: not asked for
    routed_start: int


def start_len(req: dict[str, Any], prompt_len: int) -> int:
    """SGLang's ``routed_experts_start_len`` check (scheduler.py): an integer in ``[0, prompt_len]``."""
    value = req.get("routed_experts_start_len", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= prompt_len:
        raise ValueError(f"routed_experts_start_len must be an integer in [0, {prompt_len}] for this prompt, "
                         f"got {value!r}")
    return value


def check_model(model: torch.nn.Module, cuda_graph: bool) -> None:
    if not moe_routing.moe_routers(model):
        raise ValueError("return_routed_experts needs a MoE model; this engine serves a dense one")
    if cuda_graph:
        raise ValueError("return_routed_experts is not implemented by this engine with CUDA-graph decode "
                         "(run it without --embedded-cuda-graph)")


@contextmanager
def capture(model: torch.nn.Module, reqs: Sequence[Routed], split: Callable[[torch.Tensor], list[torch.Tensor]]):
    """Record the block's forwards when a request of ``reqs`` asked; ``split`` maps the rows to each request."""
    if not any(r.routed is not None for r in reqs):
        yield
        return
    with moe_routing.record(model) as rec:
        yield
    rows = torch.cat(rec.forwards) if rec.forwards else None
    if rows is None:
        return
    for r, part in zip(reqs, split(rows), strict=True):
        if r.routed is not None:
            r.routed.append(part)


def prefill_split(prompts: list[list[int]]) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """A prefill's router rows -> each prompt's: one forward per prompt (back to back), or one left-padded
    ``[n, width]`` batch (row-major); the two agree when the prompts are equally long."""
    lengths = [len(p) for p in prompts]
    width = max(lengths)

    def split(rows: torch.Tensor) -> list[torch.Tensor]:
        if rows.shape[0] == sum(lengths):
            return list(torch.split(rows, lengths))
        if rows.shape[0] == width * len(prompts):
            grid = rows.view(len(prompts), width, *rows.shape[1:])
            return [grid[i, width - n:] for i, n in enumerate(lengths)]
        raise RuntimeError(f"prefill routed {rows.shape[0]} rows for prompts of lengths {lengths}")
    return split


def decode_split(n: int) -> Callable[[torch.Tensor], list[torch.Tensor]]:
    """A decode step's router rows -> one per running row (rows past ``n``: padding of a batch bucket)."""
    return lambda rows: [rows[i:i + 1] for i in range(n)]


def meta_value(r: Routed) -> str:
    """``meta_info["routed_experts"]``: rows ``[start, seqlen - 1)`` as SGLang's base64 int32."""
    seqlen = len(r.input_ids) + len(r.output_ids)
    rows = torch.cat(r.routed) if r.routed else torch.zeros(0, 0, 0, dtype=torch.int32)
    rows = rows[r.routed_start:max(seqlen - 1, r.routed_start)]
    return moe_routing.encode(rows.cpu().numpy())
