"""Loading HF weights into this rank's part of the GPTModel: each rank reads only its own slices.

`ShardPlan` is what this rank holds: every catalogue parameter (relax/backends/megatron/layout.py)
whose pipeline stage and expert range are this rank's, under its local megatron name.
`load_hf_weights` reads each one's slice of the HF tensors through an `HFReader`
(relax/backends/megatron/hf_source.py: safetensors ``get_slice`` or an in-memory model) and copies
it in, checking that every model parameter is covered exactly once with the right shape.
The way back (gathering full HF tensors for the weight sync, ``--save-hf`` and checksums) is
relax/backends/megatron/export.py.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from relax.backends.megatron.layout import EXTRA_STATE_SUFFIX, Param, WeightLayout, catalogue
from relax.backends.megatron.model import BuiltModel
from relax.backends.megatron.sharding import HFReader, ParallelLayout, RankPos, holds, local_name, read_shard


@dataclass(frozen=True)
class ShardPlan:
    """The model's catalogue and this rank's place in the model-parallel grid."""

    wl: WeightLayout
    par: ParallelLayout
    pos: RankPos
    vocab_size: int
    params: tuple[Param, ...]

    @classmethod
    def of(cls, built: BuiltModel, par: ParallelLayout, pos: RankPos) -> ShardPlan:
        return cls(built.layout, par, pos, built.vocab_size, tuple(catalogue(built.layout, pipeline_parallel=par.pp)))

    def mine(self) -> list[tuple[Param, str]]:
        """The parameters this rank holds a piece of, with their names in this rank's model."""
        return [(p, local_name(p, self.wl, self.par)) for p in self.params if holds(p, self.wl, self.par, self.pos)]

    def read(self, param: Param, reader: HFReader) -> torch.Tensor:
        """This rank's piece of ``param``, read slice by slice."""
        size = self.par.split_size(param)
        return read_shard(param, reader, self.pos.split_rank(param), size, self.wl, self.vocab_size)


@torch.no_grad()
def load_hf_weights(built: BuiltModel, plan: ShardPlan, reader: HFReader) -> None:
    """Copy this rank's slices of the HF weights into the model (cast to its dtype); every weight must be covered."""
    params = built.gpt.state_dict(keep_vars=True)
    expected = {k for k in params if not k.endswith(EXTRA_STATE_SUFFIX)}
    mine = plan.mine()
    names = [local for _, local in mine]
    missing, unexpected = sorted(expected - set(names)), sorted(set(names) - expected)
    if missing or unexpected or len(names) != len(set(names)):
        raise ValueError(f"the weight layout does not match this rank's GPTModel: missing={missing[:5]} "
                         f"unexpected={unexpected[:5]}")
    for param, local in mine:
        tensor = plan.read(param, reader)
        target = params[local]
        if tuple(target.shape) != tuple(tensor.shape):
            raise ValueError(f"{local}: HF slice has shape {list(tensor.shape)}, the model {list(target.shape)}")
        target.copy_(tensor.to(device=target.device, dtype=target.dtype))
