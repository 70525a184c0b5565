"""The work of the fully-async service roles (``reference``, ``actor_fwd``, ``advantages``; relax/core/services.py
says why they exist): a forward-only copy of the trainer's backend, and the trainer's advantage computation.
Their Ray actors are relax/distributed/service_actors.py.
"""

from __future__ import annotations

import torch

from relax.backends.config import TrainerConfig
from relax.backends.embedded.weights_checker import WeightsChecker
from relax.backends.torch.batch import Precomputed, build_rollout_tensors, rollout_advantages
from relax.backends.train_registry import build_train_backend


def fetch_samples(samples) -> list:
    """The train samples of a batch handle (``fetch()``) or of a plain list."""
    return samples.fetch() if hasattr(samples, "fetch") else samples


def service_config(cfg: TrainerConfig) -> TrainerConfig:
    """The services' copy of the trainer's slice: ``--ref-actor-config`` max_tokens_per_gpu becomes their token
    budget, and a Megatron copy runs on a world of one (``tensor_model_parallel_size`` 1, the only size built):
    no model, sequence or expert parallelism, nothing of the optimizer's sharding, overlap or recompute."""
    if cfg.train_backend == "megatron":
        cfg = cfg.replace(megatron=cfg.megatron.replace(
            tensor_model_parallel_size=1, pipeline_model_parallel_size=1, context_parallel_size=1,
            expert_model_parallel_size=1, expert_tensor_parallel_size=1, sequence_parallel=False,
            recompute_granularity=None, recompute_method=None, recompute_num_layers=None,
            use_distributed_optimizer=False, use_precision_aware_optimizer=False, optimizer_cpu_offload=False,
            overlap_cpu_optimizer_d2h_h2d=False, overlap_grad_reduce=False, overlap_param_gather=False))
    budget = cfg.ref_actor_config["max_tokens_per_gpu"]
    if budget is None:
        return cfg
    return cfg.replace(use_dynamic_batch_size=True, max_tokens_per_gpu=budget, log_probs_max_tokens_per_gpu=budget)


class ForwardService:
    """``reference`` or ``actor_fwd``: a forward-only copy of the trainer's backend.

    The actor_fwd copy is a weight holder of `relax.backends.embedded.weight_routes` (``model``, ``device``,
    ``weight_version``, ``update_weights_from_tensors``): its actor serves SGLang's weight endpoints, so a
    sync reaches it exactly as it reaches an engine.
    """

    def __init__(self, cfg: TrainerConfig, device: str, role: str):
        self.role = role
        self.backend = build_train_backend(service_config(cfg), device, service=role)
        if role == "reference":
            self.backend.model.eval()  # as the trainer's frozen reference copy
        self.weight_version = 0

    @property
    def model(self) -> torch.nn.Module:
        return self.backend.model

    @property
    def device(self) -> torch.device:
        return self.backend.device

    def log_probs(self, samples, part: tuple[int, int] | None = None) -> torch.Tensor:
        """``[N, T]`` log-probs of the batch; ``part`` ``(i, k)``: replica ``i`` of ``k`` computes the micro-batches
        ``i, i + k, ...`` of the batch's split and leaves zeros in the other rows (relax/core/services.py adds
        the parts)."""
        return self.backend.forward_log_probs(fetch_samples(samples), part)

    def update_weights_from_tensors(self, named: list, version: int | str | None = None) -> int:
        if self.role != "actor_fwd":
            raise RuntimeError("the reference service holds frozen weights; only actor_fwd is synced")
        self.backend.load_weights(list(named))
        if version is not None:
            self.weight_version = int(version)
        return self.weight_version

    def checker(self) -> WeightsChecker:
        """SGLang's ``/weights_checker`` over this copy's HF-named weights (a reset writes through the sync's load,
        since a Megatron copy's HF tensors are split out of its fused parameters)."""
        return WeightsChecker(self.backend.checkpoint_tensors, write=self.backend.load_weights)


class AdvantageService:
    """``advantages``: the trainer's advantage computation, on CPU, from the other services' columns."""

    def __init__(self, cfg: TrainerConfig):
        self.algo = cfg.algo
        self.group_size = cfg.n_samples_per_prompt

    def compute(self, samples, old_log_probs: torch.Tensor, ref_log_probs: torch.Tensor | None) -> Precomputed:
        batch = build_rollout_tensors(fetch_samples(samples))
        adv = rollout_advantages(self.algo, batch, self.group_size, old_log_probs, ref_log_probs,
                                 teacher_log_probs=batch.teacher_log_probs)
        return Precomputed(old_log_probs, ref_log_probs, adv.advantages, adv.returns, adv.metrics)
