"""The typed slice of flags a train backend reads (torch or Megatron, the trainer's ranks and the services' copies).

The driver builds it once (`TrainerConfig.from_args`, relax/core/runtime.py) and the trainer actors, the
fully-async services and the backends receive it; the field list is every flag the training side depends on.
The RL math's own flags come along as ``algo`` (`relax.algorithms.AlgorithmConfig`) and the Megatron backend's
layout, memory and fusion flags as ``megatron`` (relax/backends/megatron/megatron_config.py). ``args`` is kept
only for the ``--rollout-data-postprocess-path`` hook, whose seed 000 signature takes the whole namespace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax.algorithms.config import AlgorithmConfig
from relax.backends.lr_schedule import STYLES, WSD_STYLES
from relax.backends.megatron.megatron_config import MegatronConfig
from relax.observability.collective_memory import CollectiveMemoryConfig
from relax.observability.config import ProfilerConfig
from relax.observability.memory import MemoryConfig
from relax.observability.train_dumps import TrainDumpConfig
from relax.utils.flag_slice import FlagSlice, sub_slice
from relax.utils.flag_types import ConfigError


def same_model(a: str, b: str | None) -> bool:
    """``a`` and ``b`` name the same model: the same preset name or the same directory."""
    return b is not None and (a == b or Path(a).resolve() == Path(b).resolve())


@dataclass(frozen=True)
class TrainerConfig(FlagSlice):
    # the model and its numerics
    train_backend: str
    hf_checkpoint: str
    custom_model_provider_path: str | None  # builds the policy in place of relax (relax/models/provider.py)
    seed: int
    bf16: bool
    attention_backend: str | None
    # optimizer (relax/backends/optimizer.py: AdamW or SGD; the critic's rate is algo.critic_lr)
    optimizer: str
    sgd_momentum: float
    lr: float
    adam_beta1: float
    adam_beta2: float
    weight_decay: float
    clip_grad: float
    # learning-rate schedule over the run (relax/backends/lr_schedule.py)
    lr_decay_style: str
    lr_wsd_decay_iters: int | None
    lr_wsd_decay_style: str
    num_rollout: int | None
    rollout_batch_size: int
    # batches: optimizer steps, micro-batches, PPO epochs
    n_samples_per_prompt: int
    global_batch_size: int
    micro_batch_size: int
    num_iters_per_train_update: int
    use_dynamic_batch_size: bool
    max_tokens_per_gpu: int | None
    log_probs_max_tokens_per_gpu: int | None
    balance_data: bool
    # --true-on-policy-mode: every forward takes one unpadded sample, the computation the engine's log-probs repeat
    # (relax/backends/embedded/train_identical.py)
    true_on_policy_mode: bool
    # routing replay (relax/backends/torch/routing_replay.py): the policy's forwards replay the old pass's MoE
    # routing, or with --use-rollout-routing-replay the engine's
    use_routing_replay: bool
    use_rollout_routing_replay: bool
    # log-probs: the rollout's temperature, computed in vocabulary chunks
    rollout_temperature: float
    log_probs_chunk_size: int | None
    # --reset-optimizer-states: the optimizer's state dropped before each rollout's training; --use-rollout-entropy: the
    # old-log-prob pass also gives each token's entropy (the rollout-data hook's ``entropy``, train/rollout_entropy)
    reset_optimizer_states: bool
    ref_update_interval: int | None  # the reference model takes the actor's weights after every this many steps
    use_rollout_entropy: bool
    # --keep-old-actor: the old log-probs come from a copy of the weights the engines hold, which takes the
    # trainer's weights after every --update-weights-interval-th step (relax/backends/torch/old_actor.py)
    keep_old_actor: bool
    update_weights_interval: int
    # --recompute-loss-function: the logits -> log-probs -> loss part under activation checkpointing (torch backend)
    recompute_loss_function: bool
    # the device memory a CUDA trainer rank must have available when a step starts (0: no check; memory_margin.py)
    train_memory_margin_bytes: int
    # which parameters train (relax/backends/torch/freezing.py)
    only_train_params_name_list: list[str] | None
    freeze_params_name_list: list[str] | None
    # OPD with the teacher in the trainer (--opd-type megatron)
    use_opd: bool
    opd_type: str | None
    opd_teacher_load: str | None
    opd_teacher_ckpt_step: int | None  # which saved step when --opd-teacher-load is a relax checkpoint directory
    # the reference model from a relax checkpoint directory's saved step (else the initial policy)
    ref_load: str | None
    load: str | None  # --load: the policy resumes from it; without it the policy starts from --ref-load (seed 000)
    ref_ckpt_step: int | None
    # fully-async services: which roles run beside the trainer, and their token budget
    resource: Any
    ref_actor_config: dict[str, Any]
    # weight export bucket size (the Megatron backend's checksums and --save-hf)
    update_weight_buffer_size: int
    # the user hook over one step's training data (relax/backends/torch/rollout_postprocess.py)
    rollout_data_postprocess_path: str | None
    algo: AlgorithmConfig = sub_slice(AlgorithmConfig)
    megatron: MegatronConfig = sub_slice(MegatronConfig)
    profiler: ProfilerConfig = sub_slice(ProfilerConfig)  # --use-pytorch-profiler, --timeline-dump-dir's spans
    memory: MemoryConfig = sub_slice(MemoryConfig)  # --record-memory-history, --memory-snapshot-*
    collectives: CollectiveMemoryConfig = sub_slice(CollectiveMemoryConfig)  # --enable-cuda-memory-check
    dumps: TrainDumpConfig = sub_slice(TrainDumpConfig)  # --save-debug-train-data, --dump-details
    args: Any = field(default=None, compare=False, repr=False)

    @property
    def needs_reference_model(self) -> bool:
        """KL loss or KL reward shaping need the frozen reference model (in the trainer, or the `reference`
        service); the same rule as relax.utils.validation.needs_reference_model."""
        return bool(self.algo.use_kl_loss or self.algo.kl_loss_coef or self.algo.kl_coef)

    @property
    def policy_from_ref_load(self) -> bool:
        """Seed 000: ``--ref-load`` is "used as initial checkpoint for training when --load is not set": the policy
        starts from its weights (a relax checkpoint directory's step, or an HF model of the policy's shape)."""
        return self.ref_load is not None and not same_model(self.ref_load, self.hf_checkpoint) and self.load is None

    @property
    def reference_is_initial_policy(self) -> bool:
        """The reference is a copy of the initial policy: no ``--ref-load``, one naming the ``--hf-checkpoint``
        itself (seed 004 passes the model to both), or one the policy starts from (no ``--load``). Otherwise
        (``--load`` resumes the policy) it is loaded from ``--ref-load``: a relax checkpoint directory's step,
        or another HF model with the policy's vocabulary."""
        return self.ref_load is None or same_model(self.ref_load, self.hf_checkpoint) or self.load is None

    def validate(self) -> None:
        if self.lr_decay_style not in STYLES:
            raise ConfigError(f"--lr-decay-style {self.lr_decay_style!r}: one of {', '.join(STYLES)}")
        if self.lr_wsd_decay_style not in WSD_STYLES:
            raise ConfigError(f"--lr-wsd-decay-style {self.lr_wsd_decay_style!r}: one of {', '.join(WSD_STYLES)}")
