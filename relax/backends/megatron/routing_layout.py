"""Where a right-padded micro-batch's tokens sit among a megatron-core router's rows.

relax feeds GPTModel a ``[b, L]`` micro-batch (rows padded on the right, `build_model_inputs`), padded further
on the right to ``L'``, a multiple of the TP size, under ``--sequence-parallel`` (logprobs.py `gpt_forward`).
The model works seq-first: the embedding's output is ``[L', b, h]``, and with sequence parallelism it is
split along the sequence, TP rank ``r`` keeping positions ``r * L' / tp .. (r + 1) * L' / tp``. A MoE router
flattens its ``[s, b, h]`` input to ``s * b`` rows (router.py ``logits.view(-1, num_experts)``): row
``p * b + i`` is position ``p`` (of this rank's shard) of micro-batch row ``i``. Pipeline stages and expert
parallelism change nothing here: every stage's routers see the same tokens, and each rank routes its own
tokens before dispatching them to the experts' ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class RouterRows:
    """One micro-batch's ``[b, L']`` grid as one rank's routers see it."""

    batch: int  # b
    length: int  # L', the padded sequence length the model runs
    shard: int = 0  # this rank's part of the sequence: its TP rank with --sequence-parallel, else 0
    shards: int = 1  # the TP size with --sequence-parallel, else 1

    @classmethod
    def of(cls, batch: int, width: int, shard: int, shards: int) -> RouterRows:
        """For a micro-batch ``width`` tokens wide, padded as `gpt_forward` pads it (to a multiple of ``shards``)."""
        return cls(batch, width + (-width % shards), shard, shards)

    @property
    def positions(self) -> slice:
        """The sequence positions this rank's routers see."""
        per = self.length // self.shards
        return slice(self.shard * per, (self.shard + 1) * per)

    def to_router(self, grid: torch.Tensor) -> torch.Tensor:
        """``[b, L', ...]`` -> this rank's ``[s * b, ...]`` router rows (seq-first, its shard of the sequence)."""
        return grid[:, self.positions].transpose(0, 1).reshape(-1, *grid.shape[2:])

    def from_router(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's ``[s * b, ...]`` router rows -> ``[b, s, ...]`` (positions ``positions`` of each row)."""
        s = self.positions.stop - self.positions.start
        return rows.reshape(s, self.batch, *rows.shape[1:]).transpose(0, 1)
