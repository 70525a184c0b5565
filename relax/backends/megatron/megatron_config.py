"""The flags the Megatron backend reads beyond the trainer's own: its parallel layout, memory and fusions.

Built once by the driver as part of the trainer's slice (`relax.backends.config.TrainerConfig.megatron`), so the
megatron-core code never sees the flag namespace. The parse-time rules that need the machine (megatron-core
importable, a GPU, the trainer's world size) and the flags that need this backend are checked at parse time
by relax/backends/megatron/checks.py, so building this slice never refuses a torch run.
"""

from __future__ import annotations

from dataclasses import dataclass

from relax.utils.flag_slice import FlagSlice

# the flags that mean something only to the Megatron backend (off / 1 with any other backend)
MEGATRON_ONLY_FLAGS = ("use_distributed_optimizer", "no_bias_swiglu_fusion", "no_bias_dropout_fusion",
                       "no_rope_fusion", "sequence_parallel", "overlap_grad_reduce", "overlap_param_gather")
PARALLEL_SIZE_FLAGS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
                       "expert_model_parallel_size", "expert_tensor_parallel_size")


@dataclass(frozen=True)
class MegatronConfig(FlagSlice):
    # which backend runs (the other fields must stay off without megatron) and where
    train_backend: str
    device: str
    hf_checkpoint: str
    advantage_estimator: str  # ppo (the critic) is refused by this backend
    # parallel layout (relax/backends/megatron/parallel.py `ParallelSizes.of`)
    tensor_model_parallel_size: int
    pipeline_model_parallel_size: int
    context_parallel_size: int
    expert_model_parallel_size: int
    expert_tensor_parallel_size: int
    sequence_parallel: bool
    distributed_timeout_minutes: int  # megatron's process groups give up after it
    # activation recompute (memory_flags.recompute_kwargs)
    recompute_granularity: str | None
    recompute_method: str | None
    recompute_num_layers: int | None
    # optimizer sharding and offload (memory_flags.optimizer_offload_kwargs)
    use_distributed_optimizer: bool
    use_precision_aware_optimizer: bool
    optimizer_cpu_offload: bool
    overlap_cpu_optimizer_d2h_h2d: bool
    # megatron-core DDP's communication overlap (backend._wrap_for_training)
    overlap_grad_reduce: bool
    overlap_param_gather: bool
    # compiled fusions (fusions.fusion_kwargs)
    no_bias_swiglu_fusion: bool
    no_bias_dropout_fusion: bool
    no_rope_fusion: bool
    # HF <-> megatron weight conversion: raw (ours) or bridge (megatron-bridge)
    megatron_to_hf_mode: str
    model_name: str | None  # --model-name: the raw converter's family (config.model_family); default the config's
