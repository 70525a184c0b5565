"""Megatron parallel sizes: the flags, their rules, and megatron-core's ``parallel_state`` over the trainer group.

The trainer group (relax/distributed/trainer_group.py) starts one rank actor per GPU in one process
group; `init_parallel_state` lays megatron-core's grid over it: ``world = TP x CP x PP x DP``
(order tp-cp-ep-dp-pp, megatron's default: TP neighbours are adjacent ranks, so they share a node
first) and, for experts, ``world = ETP x EP x PP x expert-DP``. A world of one (no group) is made
here, as before.

What is built and what is refused (each a one-line `ConfigError`, at parse time where the flags and
the HF config suffice, `check_parallel_flags` / `check_model_fits`):

- ``--tensor-model-parallel-size``, ``--pipeline-model-parallel-size`` (even split of the layers),
  ``--expert-model-parallel-size`` / ``--expert-tensor-parallel-size`` (MoE models),
  ``--sequence-parallel`` (needs TP > 1; the local spec's norms are relax's `SequenceParallelRMSNorm`),
  data parallelism over the remaining ranks, with ``--use-distributed-optimizer`` sharding the
  optimizer over it.
- ``--context-parallel-size`` > 1: megatron-core runs context parallelism only in Transformer
  Engine's attention (``TEDotProductAttention``); its local ``DotProductAttention`` and relax's SDPA
  core attention have none.
- ``--qkv-format thd`` (packed sequences): megatron-core runs ``packed_seq_params`` only in
  Transformer Engine's attention; relax builds padded ``bshd`` micro-batches, which is what the
  default resolves to.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING

from relax.backends.megatron.sharding import ParallelLayout, RankPos
from relax.utils.flag_types import ConfigError

if TYPE_CHECKING:
    from relax.backends.megatron.megatron_config import MegatronConfig

PARALLEL_FLAGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                  "expert_model_parallel_size", "expert_tensor_parallel_size", "sequence_parallel")


@dataclass(frozen=True)
class ParallelSizes:
    tp: int = 1
    pp: int = 1
    cp: int = 1
    ep: int = 1
    etp: int = 1
    sequence_parallel: bool = False

    @classmethod
    def of(cls, cfg: MegatronConfig) -> ParallelSizes:
        return cls(cfg.tensor_model_parallel_size, cfg.pipeline_model_parallel_size, cfg.context_parallel_size,
                   cfg.expert_model_parallel_size, cfg.expert_tensor_parallel_size, bool(cfg.sequence_parallel))

    @property
    def model_parallel(self) -> int:
        return self.tp * self.cp * self.pp

    def data_parallel(self, world: int) -> int:
        return world // self.model_parallel

    @property
    def layout(self) -> ParallelLayout:
        return ParallelLayout(tp=self.tp, pp=self.pp, ep=self.ep, etp=self.etp)

    def is_trivial(self) -> bool:
        return self == ParallelSizes()


def _flag(dest: str) -> str:
    return "--" + dest.replace("_", "-")


def check_parallel_flags(sizes: ParallelSizes, world: int, *, te_available: bool) -> None:
    """Rules on the sizes alone and the trainer's world size (``--resource`` actor ranks)."""
    for dest, value in zip(PARALLEL_FLAGS[:5], (sizes.tp, sizes.pp, sizes.cp, sizes.ep, sizes.etp), strict=True):
        if value < 1:
            raise ConfigError(f"{_flag(dest)} must be >= 1, got {value}")
    if sizes.cp > 1:
        reason = ("relax splits no sequences over context-parallel ranks yet" if te_available else
                  "megatron-core runs context parallelism only in Transformer Engine's attention (TEDotProductAttention),"
                  " which is not installed; the local layer spec's attention has none")
        raise ConfigError(f"not supported yet: --context-parallel-size {sizes.cp} ({reason})")
    if sizes.sequence_parallel and sizes.tp == 1:
        raise ConfigError("--sequence-parallel needs --tensor-model-parallel-size > 1 (it splits the sequence over "
                          "the tensor-parallel ranks)")
    if sizes.ep > 1 and sizes.tp > 1 and not sizes.sequence_parallel:
        raise ConfigError("--expert-model-parallel-size > 1 with --tensor-model-parallel-size > 1 needs "
                          "--sequence-parallel (megatron-core's rule for expert parallelism)")
    if world % sizes.model_parallel:
        raise ConfigError(f"the trainer's {world} rank(s) (--resource actor) are not divisible by tensor x context x "
                          f"pipeline parallel = {sizes.tp} x {sizes.cp} x {sizes.pp} = {sizes.model_parallel}")
    expert_grid = sizes.etp * sizes.ep * sizes.pp
    if world % expert_grid:
        raise ConfigError(f"the trainer's {world} rank(s) are not divisible by expert tensor x expert x pipeline "
                          f"parallel = {sizes.etp} x {sizes.ep} x {sizes.pp} = {expert_grid}")


def check_model_fits(sizes: ParallelSizes, spec) -> None:
    """Rules that need the model (`McoreModelSpec`): what each size must divide."""
    checks = [
        (sizes.tp, spec.num_attention_heads, "--tensor-model-parallel-size", "attention heads"),
        (sizes.tp, spec.num_query_groups, "--tensor-model-parallel-size", "key/value heads (query groups)"),
        (sizes.pp, spec.num_layers, "--pipeline-model-parallel-size", "layers"),
    ]
    if spec.is_moe and sizes.tp > 1 and not sizes.sequence_parallel:
        raise ConfigError("a MoE model with --tensor-model-parallel-size > 1 needs --sequence-parallel "
                          "(megatron-core's MoE layer refuses tensor parallelism without it)")
    if spec.is_moe:
        checks += [(sizes.ep, spec.num_experts, "--expert-model-parallel-size", "experts"),
                   (sizes.etp, spec.moe_ffn_hidden_size, "--expert-tensor-parallel-size", "expert FFN size")]
    else:
        checks.append((sizes.tp, spec.ffn_hidden_size, "--tensor-model-parallel-size", "FFN size"))
        for flag, value in (("--expert-model-parallel-size", sizes.ep), ("--expert-tensor-parallel-size", sizes.etp)):
            if value > 1:
                raise ConfigError(f"{flag} {value} needs a MoE model; {spec.model_type} is dense")
    for size, count, flag, what in checks:
        if count % size:
            raise ConfigError(f"{flag} {size} must divide the model's {count} {what}")


# ---------------------------------------------------------------------- megatron-core's parallel state
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_parallel_state(sizes: ParallelSizes, seed: int, *, backend: str = "nccl", timeout_minutes: int = 10) -> None:
    """megatron-core's parallel state over the default process group (a world of one is made if there is none).

    Idempotent; also seeds megatron's CUDA RNG tracker. ``backend`` is only used for the world of one.
    """
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state, tensor_parallel

    if backend == "nccl":
        if not torch.cuda.is_available():
            raise RuntimeError("the Megatron backend needs a CUDA GPU: megatron-core does not run on CPU "
                               "(use --train-backend torch)")
        torch.cuda.set_device(torch.cuda.current_device())
    if not dist.is_initialized():
        # A world of one on a fresh port, named in init_method rather than in MASTER_PORT: the environment is
        # inherited by child processes, which would then collide with this process's store (EADDRINUSE).
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    world = dist.get_world_size()
    check_parallel_flags(sizes, world, te_available=False)
    if parallel_state.model_parallel_is_initialized():
        current = (parallel_state.get_tensor_model_parallel_world_size(),
                   parallel_state.get_pipeline_model_parallel_world_size(),
                   parallel_state.get_expert_model_parallel_world_size())
        if current != (sizes.tp, sizes.pp, sizes.ep):
            raise RuntimeError(f"megatron-core's parallel state is already set up with (TP, PP, EP) = {current}, "
                               f"not {(sizes.tp, sizes.pp, sizes.ep)} (one layout per process)")
    else:
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=sizes.tp, pipeline_model_parallel_size=sizes.pp,
            context_parallel_size=sizes.cp, expert_model_parallel_size=sizes.ep,
            expert_tensor_parallel_size=sizes.etp, distributed_timeout_minutes=timeout_minutes)
    tensor_parallel.model_parallel_cuda_manual_seed(seed)


def rank_pos() -> RankPos:
    """This rank's place in the model-parallel grid (after `init_parallel_state`)."""
    from megatron.core import parallel_state as ps

    return RankPos(tp=ps.get_tensor_model_parallel_rank(), pp=ps.get_pipeline_model_parallel_rank(),
                   ep=ps.get_expert_model_parallel_rank(), etp=ps.get_expert_tensor_parallel_rank())
