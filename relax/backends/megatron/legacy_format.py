"""Megatron-LM's per-rank checkpoint files (``relax convert --format torch``), written and read with relax's sharding.

Layout (Megatron-LM's ``get_checkpoint_name``): ``<dir>/release/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt``
per tensor-parallel rank TT, pipeline stage PPP (with PP > 1) and expert-parallel rank EEE (with EP > 1),
each holding ``{"model": <that rank's GPTModel state dict>, "checkpoint_version": 3.0, "iteration": 0}``
under local names (layers and experts counted from the rank's first), and
``<dir>/latest_checkpointed_iteration.txt`` = ``release``. Expert weights are split over the expert-
tensor-parallel ranks; this format keeps them whole (expert TP 1), every TP rank's file holding its
EP rank's experts.

Pure torch, no megatron-core: writing reads each rank's slices of the HF tensors (sharding.py) and
saves one rank file at a time; reading gathers each parameter's pieces from the rank files (memory-
mapped) and yields HF tensors bucket by bucket. So HF -> this format -> HF is bitwise the identity
(tests/test_relax_convert.py).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import torch

from relax.backends.megatron.layout import Param, WeightLayout, catalogue, separate
from relax.backends.megatron.sharding import (
    HFReader,
    ParallelLayout,
    RankPos,
    holds,
    local_name,
    owner_ep_rank,
    owner_stage,
    read_shard,
    unshard,
)

RELEASE = "release"
TRACKER = "latest_checkpointed_iteration.txt"
RANK_FILE = "model_optim_rng.pt"


def rank_dir(root: Path, par: ParallelLayout, pos: RankPos) -> Path:
    name = f"mp_rank_{pos.tp:02d}" + (f"_{pos.pp:03d}" if par.pp > 1 else "") + (f"_{pos.ep:03d}" if par.ep > 1 else "")
    return root / RELEASE / name


def positions(par: ParallelLayout) -> list[RankPos]:
    if par.etp != 1:
        raise ValueError("--format torch keeps experts whole (expert tensor parallel size 1); use --format torch_dist")
    return [RankPos(tp, pp, ep, 0) for pp, ep, tp in itertools.product(range(par.pp), range(par.ep), range(par.tp))]


def write(root: str | Path, reader: HFReader, wl: WeightLayout, par: ParallelLayout, vocab_size: int) -> list[Path]:
    """One rank file per (TP, PP, EP) rank, each read from the HF slices it needs; returns the files."""
    root = Path(root)
    params = catalogue(wl, pipeline_parallel=par.pp)
    files = []
    for pos in positions(par):
        state = {local_name(p, wl, par): read_shard(p, reader, pos.split_rank(p), par.split_size(p), wl, vocab_size)
                 .contiguous().clone() for p in params if holds(p, wl, par, pos)}
        path = rank_dir(root, par, pos)
        path.mkdir(parents=True, exist_ok=True)
        torch.save({"model": state, "checkpoint_version": 3.0, "iteration": 0}, path / RANK_FILE)
        files.append(path / RANK_FILE)
    (root / TRACKER).write_text(RELEASE)
    return files


def read_buckets(root: str | Path, wl: WeightLayout, par: ParallelLayout, vocab_size: int,
                 bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """HF tensors gathered from the rank files, in buckets of about ``bucket_bytes``."""
    root = Path(root)
    states = {}
    for pos in positions(par):
        file = rank_dir(root, par, pos) / RANK_FILE
        if not file.exists():
            raise FileNotFoundError(f"{root}: missing {file.relative_to(root)} for the layout tp={par.tp} pp={par.pp} "
                                    f"ep={par.ep} (check the sizes the checkpoint was written with)")
        states[pos] = torch.load(file, map_location="cpu", mmap=True, weights_only=True)["model"]
    bucket: list[tuple[str, torch.Tensor]] = []
    size = 0
    for param in catalogue(wl, pipeline_parallel=par.pp):
        if param.load_only:
            continue
        for name, tensor in separate(param, _gather(param, states, wl, par, vocab_size), wl):
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > bucket_bytes:
                yield bucket
                bucket, size = [], 0
            bucket.append((name, tensor))
            size += nbytes
    if bucket:
        yield bucket


def _gather(param: Param, states: dict, wl: WeightLayout, par: ParallelLayout, vocab_size: int) -> torch.Tensor:
    pp = owner_stage(param, wl.num_layers, par.pp)
    ep = owner_ep_rank(param, wl.num_experts, par.ep)
    name = local_name(param, wl, par)
    pieces = [states[RankPos(tp, pp, ep, 0)][name] for tp in range(par.split_size(param))]  # experts: whole
    return unshard(param, pieces, vocab_size)
