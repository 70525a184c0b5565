"""Which slice of each HF tensor a Megatron rank holds under tensor, pipeline and expert parallelism, and back.

Pure torch (no megatron import): the math the trainer's loading and export use, tested on CPU
(tests/test_megatron_sharding.py) for every (TP, PP, EP) that divides a model.

A rank's place is `RankPos` (tp, pp, ep, etp ranks) within a `ParallelLayout` (sizes). For each
parameter of the catalogue (relax/backends/megatron/layout.py):

- pipeline: stage ``s`` of ``pp`` holds layers ``[s*L/pp, (s+1)*L/pp)`` (even split; megatron names
  them ``decoder.layers.0..`` locally), the embedding lives on the first stage, the final norm and
  the output layer on the last;
- experts: EP rank ``e`` of ``ep`` holds experts ``[e*E/ep, (e+1)*E/ep)`` (``local_experts.0..``);
  experts are split over the expert-tensor-parallel ranks (``etp``), everything else over ``tp``;
- tensor parallelism (`Split`): row-parallel layers split columns; qkv gives each rank whole query
  groups; ``[gate; up]`` gives rank r ``[gate_r; up_r]``; the vocabulary is padded to a multiple of
  the TP size (megatron's vocab-parallel embedding needs equal shards) and split by rows, the
  padding rows being zeros that the log-probs never read (relax/backends/megatron/logprobs.py).

`read_shard` reads only a rank's rows / columns of each HF tensor (through a `HFReader`, e.g.
safetensors' ``get_slice``), so no rank materialises the full model; `shard` / `unshard` split a
full megatron tensor and join the ranks' pieces back, which is what the export's gathers compute.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from relax.backends.megatron.layout import Param, Split, WeightLayout, combine, pack_qkv


@dataclass(frozen=True)
class ParallelLayout:
    """The model-parallel sizes (data and context parallelism hold full copies and play no part here)."""

    tp: int = 1
    pp: int = 1
    ep: int = 1
    etp: int = 1

    def padded_vocab(self, vocab_size: int) -> int:
        """The vocabulary rounded up to a multiple of the TP size (the rows megatron's embedding holds)."""
        return -(-vocab_size // self.tp) * self.tp

    def split_size(self, param: Param) -> int:
        return self.etp if param.is_expert else self.tp


@dataclass(frozen=True)
class RankPos:
    """One rank's coordinates in the model-parallel grid."""

    tp: int = 0
    pp: int = 0
    ep: int = 0
    etp: int = 0

    def split_rank(self, param: Param) -> int:
        return self.etp if param.is_expert else self.tp


def _even(total: int, parts: int, what: str) -> int:
    if parts < 1 or total % parts:
        raise ValueError(f"{what}: {total} does not split evenly over {parts}")
    return total // parts


def stage_layers(num_layers: int, pp: int, stage: int) -> range:
    """The global layer indices pipeline stage ``stage`` holds."""
    per = _even(num_layers, pp, "layers over pipeline stages")
    return range(stage * per, (stage + 1) * per)


def expert_range(num_experts: int, ep: int, ep_rank: int) -> range:
    """The global expert indices expert-parallel rank ``ep_rank`` holds."""
    per = _even(num_experts, ep, "experts over expert-parallel ranks")
    return range(ep_rank * per, (ep_rank + 1) * per)


def owner_stage(param: Param, num_layers: int, pp: int) -> int:
    """The pipeline stage that holds ``param``."""
    if param.layer is not None:
        return param.layer // _even(num_layers, pp, "layers over pipeline stages")
    return 0 if param.name.startswith("embedding.") else pp - 1


def owner_ep_rank(param: Param, num_experts: int, ep: int) -> int:
    """The expert-parallel rank that holds an expert parameter (0 for the rest: every EP rank holds those)."""
    return 0 if param.expert is None else param.expert // _even(num_experts, ep, "experts over expert-parallel ranks")


def holds(param: Param, wl: WeightLayout, par: ParallelLayout, pos: RankPos) -> bool:
    """Whether the rank at ``pos`` holds a shard of ``param``."""
    if owner_stage(param, wl.num_layers, par.pp) != pos.pp:
        return False
    return param.expert is None or owner_ep_rank(param, wl.num_experts, par.ep) == pos.ep


def local_name(param: Param, wl: WeightLayout, par: ParallelLayout) -> str:
    """``param``'s name inside its stage's model: layer (and expert) indices counted from the stage's (rank's) first."""
    name = param.name
    if param.layer is not None:
        local = param.layer % _even(wl.num_layers, par.pp, "layers over pipeline stages")
        name = name.replace(f"decoder.layers.{param.layer}.", f"decoder.layers.{local}.", 1)
    if param.expert is not None:
        local = param.expert % _even(wl.num_experts, par.ep, "experts over expert-parallel ranks")
        name = name.replace(f"local_experts.{param.expert}.", f"local_experts.{local}.", 1)
    return name


_LOCAL_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.")
_LOCAL_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def global_name(name: str, wl: WeightLayout, par: ParallelLayout, pos: RankPos) -> str:
    """A parameter name of this rank's model with global layer and expert indices (inverse of `local_name`)."""
    layers = _even(wl.num_layers, par.pp, "layers over pipeline stages")
    name = _LOCAL_LAYER.sub(lambda m: f"decoder.layers.{int(m.group(1)) + pos.pp * layers}.", name, count=1)
    if wl.num_experts:
        experts = _even(wl.num_experts, par.ep, "experts over expert-parallel ranks")
        name = _LOCAL_EXPERT.sub(lambda m: f".local_experts.{int(m.group(1)) + pos.ep * experts}.", name, count=1)
    return name


# ---------------------------------------------------------------------- full megatron tensor <-> TP shards
def _chunk(length: int, rank: int, size: int, param: Param) -> slice:
    per = length // size
    if per * size != length:
        raise ValueError(f"{param.name}: {length} rows/columns do not split evenly over {size} tensor-parallel ranks")
    return slice(rank * per, (rank + 1) * per)


def shard(param: Param, full: torch.Tensor, rank: int, size: int, vocab_size: int) -> torch.Tensor:
    """Rank ``rank``'s piece (of ``size``) of the full megatron tensor ``full``."""
    split = param.split
    if split is Split.REPLICATED or size == 1 and split is not Split.VOCAB:
        return full
    if split is Split.ROW:
        return full[:, _chunk(full.shape[1], rank, size, param)]
    if split is Split.QKV:
        return full[_chunk(full.shape[0], rank, size, param)]
    if split is Split.GLU:
        gate, up = torch.chunk(full, 2, dim=0)
        rows = _chunk(gate.shape[0], rank, size, param)
        return torch.cat([gate[rows], up[rows]], dim=0)
    rows = -(-vocab_size // size)
    piece = full[rank * rows: min((rank + 1) * rows, vocab_size)]
    if piece.shape[0] == rows:
        return piece
    return torch.cat([piece, full.new_zeros(rows - piece.shape[0], *full.shape[1:])], dim=0)


def unshard(param: Param, shards: Sequence[torch.Tensor], vocab_size: int) -> torch.Tensor:
    """The full megatron tensor from every TP (or expert-TP) rank's piece, in rank order (inverse of `shard`)."""
    split = param.split
    if split is Split.REPLICATED or len(shards) == 1 and split is not Split.VOCAB:
        return shards[0]
    if split is Split.ROW:
        return torch.cat(list(shards), dim=1)
    if split is Split.QKV:
        return torch.cat(list(shards), dim=0)
    if split is Split.GLU:
        halves = [torch.chunk(s, 2, dim=0) for s in shards]
        return torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
    return torch.cat(list(shards), dim=0)[:vocab_size]


# ---------------------------------------------------------------------- reading a rank's slices of HF tensors
class HFReader(Protocol):
    """Access to HF checkpoint tensors that can read a row or column range without loading the rest."""

    def shape(self, name: str) -> tuple[int, ...]: ...

    def read(self, name: str, rows: slice | None = None, cols: slice | None = None) -> torch.Tensor: ...


def read_shard(param: Param, reader: HFReader, rank: int, size: int, wl: WeightLayout, vocab_size: int) -> torch.Tensor:
    """Rank ``rank``'s piece of ``param``, reading only the HF rows / columns it needs (equals `shard` of `combine`)."""
    split = param.split
    if split is Split.REPLICATED or size == 1 and split is not Split.VOCAB:
        return combine(param, [reader.read(name) for name in param.hf], wl)
    if split is Split.ROW:
        (name,) = param.hf
        return reader.read(name, cols=_chunk(reader.shape(name)[1], rank, size, param))
    if split is Split.GLU:
        gate, up = param.hf
        rows = _chunk(reader.shape(gate)[0], rank, size, param)
        return torch.cat([reader.read(gate, rows=rows), reader.read(up, rows=rows)], dim=0)
    if split is Split.QKV:
        groups = _chunk(wl.num_query_groups, rank, size, param)
        d, hpg = wl.head_dim, wl.heads_per_group
        q, k, v = param.hf
        parts = [reader.read(q, rows=slice(groups.start * hpg * d, groups.stop * hpg * d)),
                 reader.read(k, rows=slice(groups.start * d, groups.stop * d)),
                 reader.read(v, rows=slice(groups.start * d, groups.stop * d))]
        return pack_qkv(*parts, groups.stop - groups.start, hpg)
    (name,) = param.hf
    rows = -(-vocab_size // size)
    start, stop = rank * rows, min((rank + 1) * rows, vocab_size)
    hidden = reader.shape(name)[1:]
    piece = reader.read(name, rows=slice(start, stop)) if stop > start else None
    if piece is not None and piece.shape[0] == rows:
        return piece
    like = piece if piece is not None else reader.read(name, rows=slice(0, 1))
    pad = like.new_zeros(rows - (0 if piece is None else piece.shape[0]), *hidden)
    return pad if piece is None else torch.cat([piece, pad], dim=0)
