"""``relax convert``: offline HF <-> Megatron checkpoint conversion, in a chosen TP / PP / EP layout.

    relax convert hf-to-megatron --hf-checkpoint HF --output DIR [--format torch_dist|torch]
                                 [--tensor-model-parallel-size T --pipeline-model-parallel-size P
                                  --expert-model-parallel-size E --expert-tensor-parallel-size X]
    relax convert megatron-to-hf --load DIR --output HF [--hf-checkpoint HF] [--format ...] [sizes]

Formats:

- ``torch_dist`` (default): megatron-core's distributed checkpoint, what ``relax train --save`` writes
  in each ``iter_N/`` (relax/backends/megatron/checkpoint.py). It loads under any layout, so the sizes
  only choose how many ranks do the work: one process per rank, one CUDA GPU each (megatron-core does
  not run on CPU). Each rank reads only its slices of the HF safetensors and writes its own shards;
  the way back gathers the shards into HF tensors bucket by bucket (the weight sync's exporter).
- ``torch``: Megatron-LM's per-rank files (``release/mp_rank_TT_PPP_EEE/model_optim_rng.pt``) for
  exactly the given layout, written and read by relax's sharding math alone, on CPU
  (relax/backends/megatron/legacy_format.py).

Both write the HF config and tokenizer to ``DIR/hf_config``, so ``megatron-to-hf`` needs
``--hf-checkpoint`` only for checkpoints ``relax train`` wrote (give it the run's ``--hf-checkpoint``).
The HF side is a directory (safetensors) or a model preset. Conversions are bitwise: reshapes only.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

FORMATS = ("torch_dist", "torch")
HF_CONFIG_DIR = "hf_config"
LAYOUT_FILE = "relax_convert.json"
BUCKET_BYTES = 512 * 2**20


@dataclass(frozen=True)
class Job:
    direction: str  # hf-to-megatron | megatron-to-hf
    hf_checkpoint: str | None
    load: str | None
    output: str
    fmt: str
    sizes: tuple[int, int, int, int]  # tp, pp, ep, etp
    seed: int


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relax convert", description=__doc__.split("\n\n")[0])
    p.add_argument("direction", choices=("hf-to-megatron", "megatron-to-hf"))
    p.add_argument("--hf-checkpoint", help="HF directory or model preset (hf-to-megatron: the weights; megatron-to-hf: "
                                           "config and tokenizer, when the checkpoint has no hf_config/)")
    p.add_argument("--load", help="megatron-to-hf: the Megatron checkpoint (a relax iter_N/ directory or a converted one)")
    p.add_argument("--output", required=True, help="directory to write")
    p.add_argument("--format", dest="fmt", choices=FORMATS, default="torch_dist")
    for name in ("tensor-model-parallel-size", "pipeline-model-parallel-size", "expert-model-parallel-size",
                 "expert-tensor-parallel-size"):
        p.add_argument(f"--{name}", type=int, default=1)
    p.add_argument("--seed", type=int, default=1234, help="random init of a model preset (as relax train --seed)")
    return p


def parse(argv: list[str]) -> Job:
    ns = _parser().parse_args(argv)
    sizes = (ns.tensor_model_parallel_size, ns.pipeline_model_parallel_size, ns.expert_model_parallel_size,
             ns.expert_tensor_parallel_size)
    if min(sizes) < 1:
        raise ValueError(f"relax convert: parallel sizes must be >= 1, got {sizes}")
    if ns.direction == "hf-to-megatron" and not ns.hf_checkpoint:
        raise ValueError("relax convert hf-to-megatron needs --hf-checkpoint (an HF directory or a preset)")
    if ns.direction == "megatron-to-hf":
        if not ns.load or not Path(ns.load).is_dir():
            raise ValueError(f"relax convert megatron-to-hf: --load {ns.load!r} is not a directory")
        if not ns.hf_checkpoint and not (Path(ns.load) / HF_CONFIG_DIR).is_dir():
            raise ValueError(f"relax convert megatron-to-hf: {ns.load} has no {HF_CONFIG_DIR}/; pass --hf-checkpoint "
                             "(the training run's) for the config and tokenizer")
    return Job(ns.direction, ns.hf_checkpoint, ns.load, ns.output, ns.fmt, sizes, ns.seed)


def _hf_source(job: Job) -> str:
    """Where the HF config and tokenizer come from."""
    return job.hf_checkpoint or str(Path(job.load) / HF_CONFIG_DIR)


def _model_shape(source: str, seed: int):
    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.layout import WeightLayout
    from relax.models import resolve_checkpoint

    config = resolve_checkpoint(source).config
    spec = McoreModelSpec.from_hf(config)
    return config, spec, WeightLayout.from_spec(spec)


def _write_hf_config(job: Job, config) -> None:
    from relax.models import load_tokenizer

    out = Path(job.output) / HF_CONFIG_DIR
    config.save_pretrained(out)
    load_tokenizer(job.hf_checkpoint).save_pretrained(out)


# ---------------------------------------------------------------------- --format torch (CPU, one process)
def _convert_torch(job: Job) -> None:
    from relax.backends.megatron import legacy_format
    from relax.backends.megatron.hf_export import write_hf_checkpoint
    from relax.backends.megatron.hf_source import open_hf_weights
    from relax.backends.megatron.sharding import ParallelLayout

    par = ParallelLayout(*job.sizes)
    if job.direction == "hf-to-megatron":
        config, reader = open_hf_weights(job.hf_checkpoint, seed=job.seed)
        _, spec, wl = _model_shape(job.hf_checkpoint, job.seed)
        _check_fits(job, spec)
        legacy_format.write(job.output, reader, wl, par, spec.vocab_size)
        _write_hf_config(job, config)
        (Path(job.output) / LAYOUT_FILE).write_text(json.dumps({"format": "torch", "sizes": list(job.sizes)}))
        return
    config, spec, wl = _model_shape(_hf_source(job), job.seed)
    buckets = legacy_format.read_buckets(job.load, wl, par, spec.vocab_size, BUCKET_BYTES)
    write_hf_checkpoint(job.output, buckets, config, _hf_source(job), tied=spec.tie_word_embeddings)


def _check_fits(job: Job, spec) -> None:
    from relax.backends.megatron.parallel import ParallelSizes, check_model_fits

    tp, pp, ep, etp = job.sizes
    check_model_fits(ParallelSizes(tp=tp, pp=pp, ep=ep, etp=etp, sequence_parallel=tp > 1 and spec.is_moe), spec)


# ---------------------------------------------------------------------- --format torch_dist (one GPU per rank)
def world_size(sizes: tuple[int, int, int, int]) -> int:
    """The fewest ranks that hold the layout: dense TP x PP and expert ETP x EP x PP both divide it."""
    tp, pp, ep, etp = sizes
    return math.lcm(tp * pp, etp * ep * pp)


def _dist_worker(rank: int, world: int, port: int, job: Job) -> None:
    import torch
    import torch.distributed as dist

    from relax.backends.megatron.checkpoint import load_checkpoint, save_checkpoint
    from relax.backends.megatron.export import HFExporter
    from relax.backends.megatron.hf_export import write_hf_checkpoint
    from relax.backends.megatron.hf_source import open_hf_weights
    from relax.backends.megatron.model import build_gpt_model
    from relax.backends.megatron.parallel import ParallelSizes, init_parallel_state, rank_pos
    from relax.backends.megatron.weights import ShardPlan, load_hf_weights

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world)
    tp, pp, ep, etp = job.sizes
    config, spec, _ = _model_shape(_hf_source(job), job.seed)
    sizes = ParallelSizes(tp=tp, pp=pp, ep=ep, etp=etp, sequence_parallel=tp > 1 and spec.is_moe)
    init_parallel_state(sizes, job.seed)
    built = build_gpt_model(spec, sizes=sizes, extra_config={"bias_activation_fusion": False,
                                                             "bias_dropout_fusion": False})
    plan = ShardPlan.of(built, sizes.layout, rank_pos())
    meta = {"distributed_optimizer": False, "tp": tp, "pp": pp, "ep": ep, "etp": etp, "dp": world // (tp * pp)}
    if job.direction == "hf-to-megatron":
        _, reader = open_hf_weights(job.hf_checkpoint, seed=job.seed)
        load_hf_weights(built, plan, reader)
        save_checkpoint(job.output, built.gpt, None, save_optimizer=False, meta=meta)
        if rank == 0:
            _write_hf_config(job, config)
    else:
        load_checkpoint(job.load, built.gpt, None, meta=meta)
        write_hf_checkpoint(job.output, HFExporter(built, plan).buckets(BUCKET_BYTES), config, _hf_source(job),
                            tied=spec.tie_word_embeddings)
    dist.destroy_process_group()


def _convert_dist(job: Job) -> None:
    import torch
    import torch.multiprocessing as mp

    world = world_size(job.sizes)
    found = torch.cuda.device_count()
    if found < world:
        raise ValueError(f"relax convert --format torch_dist runs one rank per CUDA GPU: the layout "
                         f"tp={job.sizes[0]} pp={job.sizes[1]} ep={job.sizes[2]} etp={job.sizes[3]} needs {world}, "
                         f"found {found} (the checkpoint loads under any layout, so convert with sizes 1, or use "
                         "--format torch on CPU)")
    if job.direction == "hf-to-megatron":
        _check_fits(job, _model_shape(job.hf_checkpoint, job.seed)[1])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_dist_worker, args=(world, port, job), nprocs=world, join=True)


def main(argv: list[str] | None = None) -> int:
    try:
        job = parse(sys.argv[1:] if argv is None else argv)
        (_convert_torch if job.fmt == "torch" else _convert_dist)(job)
    except (ValueError, FileNotFoundError) as exc:
        print(f"relax convert: {exc}", file=sys.stderr)
        return 2
    print(f"relax convert: wrote {job.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
