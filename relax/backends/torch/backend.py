"""The plain-PyTorch training backend (CPU and GPU) over an HF causal LM.

One `train_rollout` call does a whole RL step on the trainer side:
old (and reference) log-probs -> advantages -> ``num_steps`` optimizer steps, each with
gradient accumulation over micro-batches, repeated ``--num-iters-per-train-update`` times over
the same batch (PPO epochs: old/ref log-probs and advantages stay the ones computed first).
With the fully-async services (`relax.core.services`) the log-probs and advantages arrive
precomputed (`Precomputed`) and the trainer only runs the optimizer steps; a service builds
this same class with ``service=role`` (no optimizer, no grads) so its log-probs come
from exactly this code. Old log-probs are computed with exactly the
micro-batch slicing the loss uses, so at the first optimizer step the PPO ratio is
exactly 1 (``train/ppo_kl`` == 0), which the harness checks. Micro-batches are fixed-size or
packed by token count (`relax.backends.torch.micro_batches`); the loss is normalised over the
whole optimizer step either way. Parameter freezing (`relax.backends.torch.freezing`) and
chunked log-probs (``--log-probs-chunk-size``) live here too, so every backend that inherits
this RL step gets them.
"""

from __future__ import annotations

import copy
import random
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.checkpoint import checkpoint

from relax.algorithms import AdvantageOutput, policy_loss
from relax.algorithms.critic import should_update_actor
from relax.algorithms.reducers import merge_metrics
from relax.backends.config import TrainerConfig
from relax.backends.lr_schedule import LRSchedule
from relax.backends.nonfinite import nonfinite_gradient_error
from relax.backends.optimizer import build_optimizer, load_saved_state
from relax.backends.torch.batch import (
    Precomputed,
    RolloutTensors,
    TrainSample,
    build_model_inputs,
    build_rollout_tensors,
    rollout_advantages,
)
from relax.backends.torch.data_parallel import DataParallel
from relax.backends.torch.freezing import apply_param_freezing
from relax.backends.torch.logprobs import log_probs_from_logits, response_log_probs
from relax.backends.torch.master_weights import MasterWeights
from relax.backends.torch.memory_margin import check_margin
from relax.backends.torch.micro_batches import fixed_micro_batches, micro_batches
from relax.backends.torch.rollout_postprocess import postprocess_rollout_data
from relax.backends.torch.step_report import CONSUMED_KEY, consumed_samples, logprob_mismatch_metrics
from relax.backends.torch.vision_inputs import model_forward
from relax.checkpoint_io import HostFile, to_host, write_files
from relax.distributed.resources import service_roles
from relax.models import build_model, hf_attention
from relax.models.checkpoint_names import checkpoint_state, moe_style
from relax.observability.collective_memory import CHECK as COLLECTIVE_MEMORY
from relax.observability.collective_memory import SUMMARY_KEY as COLLECTIVE_MEMORY_KEY
from relax.observability.memory import MemoryRecorder
from relax.observability.profiler import TrainProfiler
from relax.observability.spans import SPANS_KEY
from relax.observability.train_dumps import dump_step
from relax.utils.fault_hooks import fault_at
from relax.weights.checksum import state_checksums

__all__ = ["TorchTrainBackend"]


def _vocab(model: torch.nn.Module) -> int:
    """The rows of the model's logits (a VL model's config keeps its vocab_size in text_config)."""
    return int(model.get_output_embeddings().weight.shape[0])


class TorchTrainBackend:
    """Owns the policy (and frozen reference) model and its optimizer.

    ``service`` (``reference`` / ``actor_fwd``): a forward-only copy for that fully-async service role
    (``--ref-actor-config`` ``only_load_weight``): one model without grads, optimizer, teacher or critic; the
    reference's holds the reference weights (`_reference_model`).
    """

    master: MasterWeights | None = None  # fp32 master weights with --bf16 (master_weights.py)
    routing = None  # --use-routing-replay: RoutingReplay (routing_replay.py)
    old_actor = None  # --keep-old-actor: OldActor (old_actor.py)
    loss_function_runs = 0  # --recompute-loss-function: how often the checkpointed loss ran (twice per micro-batch)

    def __init__(self, cfg: TrainerConfig, device: str, *, service: str | None = None):
        self.cfg = cfg
        self.algo = cfg.algo
        self.device = torch.device(device)
        self.dp = DataParallel.current()  # the trainer group's ranks (relax/backends/torch/data_parallel.py)
        torch.manual_seed(cfg.seed)
        self.dtype = torch.bfloat16 if cfg.bf16 else torch.float32
        self.model = self._build_policy().to(self.device)
        if cfg.policy_from_ref_load:
            self._start_from_ref_load()
        self.model.train()
        self.ref_model = None
        if service is not None:
            self._init_inference_only(service)
            return
        # with a `reference` service the frozen copy lives there, not here
        if cfg.needs_reference_model and "reference" not in service_roles(cfg.resource):
            self.ref_model = self._reference_model()
        self.frozen_params = apply_param_freezing(self.model, cfg.only_train_params_name_list,
                                                  cfg.freeze_params_name_list)
        if cfg.keep_old_actor:  # the weights the engines generate with (same train/eval mode as the policy)
            from relax.backends.torch.old_actor import OldActor

            self.old_actor = OldActor(copy.deepcopy(self.model), cfg.update_weights_interval)
        trainable = [(n, p) for n, p in self.model.named_parameters() if p.requires_grad]
        if cfg.bf16:
            self.master = MasterWeights(trainable)
        self.optimizer = build_optimizer(
            list(self.master.params) if self.master is not None else [p for _, p in trainable], cfg, cfg.lr)
        self.schedule = LRSchedule.of(cfg)
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self._step = 0  # the rollout step being trained (for fault hooks)
        self._rollout_entropy: torch.Tensor | None = None  # --use-rollout-entropy: this step's old-policy entropy
        self._step_old_lp: torch.Tensor | None = None  # `_old_log_probs_from_step`: filled by the step's forward
        self._step_old_seen: torch.Tensor | None = None  # and the rows it filled
        # OPD with the teacher in the training backend (--opd-type megatron; the torch backend plays that role).
        # With --opd-type sglang the teacher's log-probs arrive with the samples (relax.engine.rollout.opd_teacher).
        self.teacher = None
        if cfg.use_opd and cfg.opd_type == "megatron":
            self.teacher = self._build_saved(cfg.opd_teacher_load, cfg.opd_teacher_ckpt_step, "--opd-teacher-ckpt-step")
            self.teacher = self.teacher.to(self.device).eval().requires_grad_(False)
            if _vocab(self.teacher) != _vocab(self.model):
                raise ValueError(f"--opd-teacher-load {cfg.opd_teacher_load}: vocab {_vocab(self.teacher)} "
                                 f"differs from the student's {_vocab(self.model)}")
        self.critic = None
        if cfg.algo.advantage_estimator == "ppo":
            from relax.backends.torch.critic import Critic

            self.critic = Critic(cfg, self.device, self.pad_id, self.dp)
        self._train_offloader = None  # built on the first --offload-train call
        # --use-pytorch-profiler traces and the --timeline-dump-dir trainer spans (relax/observability/profiler.py)
        self.profiler = TrainProfiler(cfg.profiler, rank=self.dp.rank)
        if cfg.use_routing_replay:  # the routing the policy's forwards replay
            from relax.backends.torch.routing_replay import RoutingReplay

            self.routing = RoutingReplay(self.model, from_rollout=cfg.use_rollout_routing_replay,
                                         sum_rows=self.dp.sum_rows)
        self.memory = MemoryRecorder(cfg.memory, rank=self.dp.rank)  # CUDA allocator snapshots

    def _build_policy(self) -> torch.nn.Module:
        """The policy: ``--hf-checkpoint``'s model, or what ``--custom-model-provider-path`` builds for its config."""
        if not self.cfg.custom_model_provider_path:
            return self._build(self.cfg.hf_checkpoint)
        from relax.models.provider import build_provided_model

        attn = hf_attention(self.cfg.attention_backend)
        return build_provided_model(self.cfg.custom_model_provider_path, self.cfg.hf_checkpoint, dtype=self.dtype,
                                    seed=self.cfg.seed, attn_implementation=attn)

    def _build(self, name_or_path: str) -> torch.nn.Module:
        """A model in the training dtype, with ``--attention-backend``'s attention (`hf_attention`)."""
        attn = hf_attention(self.cfg.attention_backend)
        return build_model(name_or_path, dtype=self.dtype, seed=self.cfg.seed, attn_implementation=attn)

    def _reference_model(self) -> torch.nn.Module:
        """The frozen reference: ``--ref-load``'s model (a ``relax train --save`` directory's step of
        ``--ref-ckpt-step``, or another HF model with the policy's vocabulary), else a copy of the initial policy."""
        if self.cfg.reference_is_initial_policy:
            return copy.deepcopy(self.model).eval().requires_grad_(False)
        ref = self._build_saved(self.cfg.ref_load, self.cfg.ref_ckpt_step, "--ref-ckpt-step").to(self.device)
        if _vocab(ref) != _vocab(self.model):
            raise ValueError(f"--ref-load {self.cfg.ref_load}: vocab {_vocab(ref)} differs from the policy's "
                             f"{_vocab(self.model)} (the KL compares log-probs of the same tokens)")
        return ref.eval().requires_grad_(False)

    def _start_from_ref_load(self) -> None:
        """Seed 000: without ``--load`` the policy starts from ``--ref-load``'s weights, which must fit its shape: a
        relax checkpoint's are loaded into it in place, another HF model's copied over from a built one."""
        from relax.checkpoint import is_checkpoint_root

        if is_checkpoint_root(self.cfg.ref_load):
            self._load_saved(self.model, self.cfg.ref_load, self.cfg.ref_ckpt_step, "--ref-ckpt-step")
            return
        mine, theirs = self.model.state_dict(), self._build(self.cfg.ref_load).state_dict()
        if mine.keys() != theirs.keys() or any(mine[k].shape != theirs[k].shape for k in mine):
            raise ValueError(f"--ref-load {self.cfg.ref_load}: not a model of --hf-checkpoint "
                             f"{self.cfg.hf_checkpoint}'s shape, and without --load the policy starts from it")
        self.model.load_state_dict(theirs)

    def _build_saved(self, path: str, step: int | None, flag: str) -> torch.nn.Module:
        """``path`` as a model: an HF directory or preset, or a ``relax train --save`` directory, whose checkpoint
        of ``step`` (``flag``; else its latest) holds the weights of an ``--hf-checkpoint``-shaped model."""
        from relax.checkpoint import is_checkpoint_root

        if not is_checkpoint_root(path):
            return self._build(path)
        return self._load_saved(self._build_policy(), path, step, flag).to(self.dtype)

    def _load_saved(self, model: torch.nn.Module, path: str, step: int | None, flag: str) -> torch.nn.Module:
        """``model`` (``--hf-checkpoint``-shaped) with the weights of ``path``'s checkpoint of ``step`` (``flag``; else
        its latest), loaded in place."""
        from safetensors.torch import load_file

        from relax import checkpoint as ckpt

        directory = (ckpt.find_step(path, step, flag=flag) if step is not None
                     else ckpt.find_latest(path, flag=flag, driver_state=False))
        state = load_file(str(directory / "model.safetensors"))
        missing, unexpected = model.load_state_dict(state, strict=False)
        if unexpected or missing:
            raise ValueError(f"{flag}: checkpoint {directory} does not match --hf-checkpoint {self.cfg.hf_checkpoint}")
        return model

    def _init_inference_only(self, service: str) -> None:
        if service == "reference" and not self.cfg.reference_is_initial_policy:
            self.model = self._reference_model()  # --ref-load's weights, not the initial policy's
        self.model.requires_grad_(False)
        self.frozen_params, self.optimizer, self.teacher, self.critic = [], None, None, None
        self.pad_id = int(getattr(self.model.config, "pad_token_id", None) or 0)
        self._step = 0
        self._train_offloader = None

    # ------------------------------------------------------------------ forward passes
    def _global_batches(self, n: int) -> list[slice]:
        """One slice per optimizer step."""
        return fixed_micro_batches(0, n, self.cfg.global_batch_size)

    def _micro_batches(self, samples: list[TrainSample], gsl: slice, *, log_probs: bool = False) -> list[slice]:
        """This data-parallel rank's micro-batches (absolute row slices) of one optimizer step's rows ``gsl``.

        With ``--use-dynamic-batch-size`` they are packed by token count: ``--max-tokens-per-gpu``
        for the train forward, ``--log-probs-max-tokens-per-gpu`` for the no-grad log-prob passes
        (equal by default, and then the same split, which keeps step-0 ``ppo_kl`` exactly 0).
        Without it the train forward takes ``--micro-batch-size`` samples, and a given
        ``--max-tokens-per-gpu`` (seed 004's template passes it so) still budgets the no-grad
        log-prob passes, which keep no activations and so fit more samples per pass.
        """
        cfg = self.cfg
        if cfg.true_on_policy_mode:  # one sample per forward, unpadded: the engine's log-probs are this computation
            return self.dp.mine([slice(i, i + 1) for i in range(gsl.start, gsl.stop)], None)
        max_tokens = cfg.log_probs_max_tokens_per_gpu if log_probs else None
        if cfg.use_dynamic_batch_size:
            max_tokens = cfg.log_probs_max_tokens_per_gpu if log_probs else cfg.max_tokens_per_gpu
        lengths = [len(s.tokens) for s in samples]
        slices = micro_batches(lengths, gsl.start, gsl.stop, micro_batch_size=cfg.micro_batch_size,
                               max_tokens=max_tokens)
        costs = [(sl.stop - sl.start) * max(lengths[sl]) for sl in slices] if cfg.balance_data else None
        return self.dp.mine(slices, costs)

    def _all_micro_batches(self, samples: list[TrainSample], *, log_probs: bool = False) -> list[slice]:
        return [sl for gsl in self._global_batches(len(samples))
                for sl in self._micro_batches(samples, gsl, log_probs=log_probs)]

    def _policy_forward(self, model: torch.nn.Module, sl: slice, inputs, *, with_entropy: bool):
        """`_forward_log_probs` of rows ``sl``, replaying or recording their MoE routing (--use-routing-replay)."""
        if self.routing is None:
            return self._forward_log_probs(model, inputs, with_entropy=with_entropy)
        with self.routing.forward(model, sl, inputs):
            return self._forward_log_probs(model, inputs, with_entropy=with_entropy)

    def _forward_log_probs(self, model: torch.nn.Module, inputs, *, with_entropy: bool):
        """Response log-probs (and entropy) of one micro-batch; backends override the forward."""
        return response_log_probs(model, inputs, temperature=self.cfg.rollout_temperature, with_entropy=with_entropy,
                                  chunk_size=self.cfg.log_probs_chunk_size)

    @torch.no_grad()
    def _log_probs_no_grad(self, model: torch.nn.Module, batch: RolloutTensors) -> torch.Tensor:
        return self._log_probs_and_entropy_no_grad(model, batch, with_entropy=False)[0]

    @torch.no_grad()
    def _log_probs_and_entropy_no_grad(self, model: torch.nn.Module, batch: RolloutTensors, *,
                                       with_entropy: bool = True,
                                       part: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[N, T]`` response log-probs under ``model`` and, ``with_entropy``, each token's entropy in the same pass.
        ``part`` ``(i, k)``: only micro-batches ``i, i + k, ...`` (a service replica's share); zeros elsewhere."""
        width = batch.loss_mask.shape[1]
        out = torch.zeros_like(batch.loss_mask)
        ent = torch.zeros_like(batch.loss_mask) if with_entropy else None
        slices = self._all_micro_batches(batch.samples, log_probs=True)
        for sl in slices if part is None else slices[part[0]::part[1]]:
            inputs = build_model_inputs(batch.samples[sl], width, self.pad_id, self.device)
            lp, entropy = self._policy_forward(model, sl, inputs, with_entropy=with_entropy)
            out[sl] = lp.cpu()
            if ent is not None:
                ent[sl] = entropy.to(ent.dtype).cpu()
        return self._rows_everywhere(out), None if ent is None else self._rows_everywhere(ent)

    # ------------------------------------------------------------------ services (fully-async)
    def forward_log_probs(self, samples: list[TrainSample], part: tuple[int, int] | None = None) -> torch.Tensor:
        """``[N, T]`` response log-probs of ``samples`` under this backend's model (what a service returns); ``part``:
        a replica's share of the micro-batches (`_log_probs_and_entropy_no_grad`)."""
        batch = build_rollout_tensors(samples)
        if part is None:
            return self._log_probs_no_grad(self.model, batch)
        return self._log_probs_and_entropy_no_grad(self.model, batch, with_entropy=False, part=part)[0]

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """Copy HF-named tensors (one bucket of a weight sync) into the model: a service's copy of the policy."""
        state = self.checkpoint_tensors()
        unknown = [name for name, _ in named_tensors if name not in state]
        if unknown:
            raise ValueError(f"unknown weights {unknown[:3]} (not in the model's state dict)")
        with torch.no_grad():
            for name, tensor in named_tensors:
                state[name].copy_(tensor.to(state[name].device, state[name].dtype))

    # ------------------------------------------------------------------ one RL step
    def train_rollout(self, samples: list[TrainSample], step: int,
                      precomputed: Precomputed | None = None) -> dict[str, float]:
        """One RL step. ``precomputed``: columns the fully-async services computed (`relax.core.services`)."""
        check_margin(self.cfg.train_memory_margin_bytes, self.device, step)  # --train-memory-margin-bytes
        self.profiler.start("train_overall", step)
        with self.memory.step(step):
            metrics = self._train_rollout(samples, step, precomputed)
        self.profiler.stop("train_overall", step)
        if spans := self.profiler.pop_spans():
            metrics[SPANS_KEY] = spans
        if collectives := COLLECTIVE_MEMORY.pop_summary():  # --enable-cuda-memory-check: since the last step
            metrics[COLLECTIVE_MEMORY_KEY] = collectives
        return metrics

    def _train_rollout(self, samples: list[TrainSample], step: int, precomputed: Precomputed | None) -> dict[str, float]:
        cfg = self.cfg
        self._step = step
        batch = build_rollout_tensors(samples)
        n = len(samples)
        if n % cfg.global_batch_size:
            raise ValueError(f"rollout produced {n} samples, not a multiple of --global-batch-size {cfg.global_batch_size}")
        start = time.perf_counter()
        precomputed = precomputed or Precomputed()
        from_step = self._old_log_probs_from_step(batch, step, precomputed)
        # the step's forward fills this in place of the old-log-prob forward (`_micro_batch_loss`)
        self._step_old_lp = torch.zeros_like(batch.loss_mask) if from_step else None
        self._step_old_seen = torch.zeros(n, dtype=torch.bool) if from_step else None
        self.profiler.start("train_log_probs", step)
        if self.routing is not None:
            self.routing.begin(samples)
        old_lp, ref_lp, teacher_lp, old_values, adv = self._rollout_columns(batch, precomputed, old=not from_step)
        if self.routing is not None:  # the old pass's routing, recorded on each rank, for every rank's update
            self.routing.share()
        self.profiler.stop("train_log_probs", step)
        if cfg.reset_optimizer_states:  # before this rollout's first step: no moments from earlier rollouts
            self._reset_optimizer_states()
        postprocess_rollout_data(cfg, step, batch, old_lp, ref_lp, adv, entropy=self._rollout_entropy)
        if self.dp.rank == 0:  # --save-debug-train-data, --dump-details (relax/observability/train_dumps.py)
            dump_step(cfg.dumps, step, batch, old_lp, ref_lp, adv.advantages)
        columns_s = time.perf_counter() - start  # the columns are on the host: their forwards have finished
        metrics: dict[str, float] = {f"train/{k}": float(v) for k, v in adv.metrics.items()}
        metrics["train/old_log_probs_from_step"] = float(from_step)
        if self._rollout_entropy is not None:  # --use-rollout-entropy: the old policy's, over the loss mask
            mask = batch.loss_mask
            metrics["train/rollout_entropy"] = float((self._rollout_entropy * mask).sum() / mask.sum().clamp(min=1))
        if teacher_lp is not None:  # sampled-token estimate of KL(student || teacher)
            gap = (old_lp - teacher_lp) * batch.loss_mask
            metrics["train/opd_reverse_kl"] = float(gap.sum() / batch.loss_mask.sum().clamp(min=1))
        if batch.rollout_log_probs is not None and not from_step:
            metrics.update(logprob_mismatch_metrics(old_lp, batch.rollout_log_probs, batch.loss_mask))
        per_step: dict[str, list[float]] = defaultdict(list)
        update_actor = should_update_actor(self.algo, step)
        num_steps = 0
        passes = torch.zeros(n)  # per row: how often the loss saw it (the consumed report)
        self.profiler.start("train_actor", step)
        # PPO epochs: every iteration reuses the old/ref log-probs and advantages computed above
        for _ in range(cfg.num_iters_per_train_update):
            for gsl in self._global_batches(n):
                micro = self._micro_batches(samples, gsl)
                if fault_at("TRAINER_DROP_SAMPLE", step) and micro and micro[-1].stop - micro[-1].start > 1:
                    micro[-1] = slice(micro[-1].start, micro[-1].stop - 1)  # planted defect: a row never trains
                for sl in micro if update_actor or self.critic is not None else ():
                    passes[sl] += 1
                for group in self.optimizer.param_groups:  # --lr-decay-style: this step's rate
                    group["lr"] = self.schedule.lr_at(step, num_steps)
                step_metrics = (self._optimizer_step(batch, gsl, old_lp, ref_lp, adv.advantages, micro)
                                if update_actor else {})
                if self.critic is not None:
                    step_metrics.update(self.critic.train_step(batch, gsl, micro, old_values, adv.returns, step))
                num_steps += int(update_actor or self.critic is not None)
                for key, value in step_metrics.items():
                    per_step[key].append(value)
        self.profiler.stop("train_actor", step)
        metrics.update({f"train/{k}": float(np.mean(v)) for k, v in per_step.items()})
        if from_step:  # the old log-probs exist only now, for the rows the step saw
            old_lp = self._rows_everywhere(self._step_old_lp)
            seen = self._rows_everywhere(self._step_old_seen.to(old_lp.dtype)) > 0
            self._step_old_lp = self._step_old_seen = None
            if batch.rollout_log_probs is not None:
                metrics.update(logprob_mismatch_metrics(old_lp, batch.rollout_log_probs,
                                                        batch.loss_mask * seen[:, None]))
        # each optimizer step ends with the grad norm on the host: its kernels have finished
        metrics["perf/train_columns_time_s"] = columns_s
        metrics["perf/train_update_time_s"] = time.perf_counter() - start - columns_s
        metrics["train/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics["train/num_optimizer_steps"] = float(num_steps)
        if self.routing is not None:
            metrics.update(self.routing.metrics())
        if self.old_actor is not None:  # --keep-old-actor: a step that ends with a sync moves the copy on
            metrics["train/old_actor_refreshed"] = float(self.old_actor.after_step(step, self._policy_module()))
        if self.ref_model is not None and cfg.ref_update_interval and (step + 1) % cfg.ref_update_interval == 0:
            self._update_reference()  # --ref-update-interval: the next rollouts' KL is to this policy
            metrics["train/ref_updated"] = 1.0
        if any(s.sample_id is not None for s in samples):
            metrics[CONSUMED_KEY] = consumed_samples([s.sample_id for s in samples], self.dp.sum_rows(passes))
        return metrics

    def _old_log_probs_from_step(self, batch: RolloutTensors, step: int, pre: Precomputed) -> bool:
        """Whether the optimizer step's own forward can stand in for the old-log-prob forward, as TRL's GRPO does
        when one generation feeds one update: the rollout is one optimizer step, run once
        (``--num-iters-per-train-update 1``), so that forward sees the weights the rollout was generated with,
        and nothing needs the old log-probs before it (advantages without a KL-in-reward, reference, teacher
        or critic term; no rollout-data hook; not precomputed by the services). Its log-probs, detached, are
        the old ones (the PPO ratio is exactly 1 at that step, as with the separate forward); the
        train/rollout mismatch metrics are computed from them after the step."""
        cfg = self.cfg
        return (pre.old_log_probs is None and cfg.num_iters_per_train_update == 1
                and len(batch.samples) == cfg.global_batch_size and should_update_actor(self.algo, step)
                and self.ref_model is None and pre.ref_log_probs is None and not cfg.needs_reference_model
                and self.teacher is None and batch.teacher_log_probs is None and self.critic is None
                and not cfg.rollout_data_postprocess_path and not cfg.use_rollout_entropy and self.old_actor is None)

    def _rows_everywhere(self, rows: torch.Tensor) -> torch.Tensor:
        """``[N, T]`` filled by this rank's micro-batches -> the whole matrix on every rank."""
        return self.dp.sum_rows(rows)

    def _rollout_columns(self, batch: RolloutTensors, pre: Precomputed, *, old: bool = True):
        """Old, reference and teacher log-probs, critic values and advantages: the precomputed ones, else computed here
        (``old`` False: no old log-probs, `_old_log_probs_from_step`). The old policy is the trainer's model, or with
        ``--keep-old-actor`` the copy of the weights the engines generated with."""
        pre.check_rows(len(batch.samples), batch.loss_mask.shape[1])
        old_lp, self._rollout_entropy = pre.old_log_probs, None
        old_model = self.model if self.old_actor is None else self.old_actor.model
        if self.cfg.use_rollout_entropy:  # the old policy's per-token entropy, from the old-log-prob pass
            lp, self._rollout_entropy = self._log_probs_and_entropy_no_grad(old_model, batch)
            old_lp = lp if old_lp is None else old_lp
        if old_lp is None and old:
            old_lp = self._log_probs_no_grad(old_model, batch)
        ref_lp = pre.ref_log_probs
        if ref_lp is None and self.ref_model is not None:
            ref_lp = self._log_probs_no_grad(self.ref_model, batch)
        if ref_lp is None and self.cfg.needs_reference_model:
            raise RuntimeError("the reference model lives in the `reference` service, but no reference log-probs "
                               "were passed to train_rollout")
        teacher_lp = batch.teacher_log_probs
        if self.teacher is not None:
            teacher_lp = self._log_probs_no_grad(self.teacher, batch)
        old_values = self.critic.values(batch, self._all_micro_batches(batch.samples)) if self.critic is not None else None
        if pre.advantages is not None:  # cloned: the rollout-data hook edits them in place
            returns = None if pre.returns is None else pre.returns.clone()
            return old_lp, ref_lp, teacher_lp, old_values, AdvantageOutput(pre.advantages.clone(), returns,
                                                                           dict(pre.metrics))
        adv = rollout_advantages(self.algo, batch, self.cfg.n_samples_per_prompt, old_lp, ref_lp, old_values, teacher_lp)
        return old_lp, ref_lp, teacher_lp, old_values, adv

    def _optimizer_step(
        self,
        batch: RolloutTensors,
        gsl: slice,
        old_lp: torch.Tensor | None,
        ref_lp: torch.Tensor | None,
        advantages: torch.Tensor,
        micro: list[slice] | None = None,
    ) -> dict[str, float]:
        """One optimizer step over the rows ``gsl``; ``micro``: this rank's micro-batches of them (default: the
        usual split)."""
        micro = self._micro_batches(batch.samples, gsl) if micro is None else micro
        width = batch.loss_mask.shape[1]
        totals = self._step_totals(batch, gsl)
        self._zero_grad()
        sums: dict[str, torch.Tensor] = {}
        for sl in micro:  # the loss divides by the step's totals, not sl's
            inputs = build_model_inputs(batch.samples[sl], width, self.pad_id, self.device)
            if self.cfg.recompute_loss_function:
                loss, m = self._recomputed_loss(batch, sl, inputs, old_lp, ref_lp, advantages, totals)
            else:
                lp, entropy = self._policy_forward(self.model, sl, inputs, with_entropy=True)
                loss, m = self._micro_batch_loss(batch, sl, lp, entropy, old_lp, ref_lp, advantages, totals)
            loss.backward()
            if self.master is not None:  # --bf16: this micro-batch's gradients into the fp32 masters
                self.master.accumulate()
            sums = merge_metrics(sums, {k: v.detach().cpu() for k, v in m.items()})
        out = {k: float(v) for k, v in self.dp.merge_metrics(sums).items()}
        out["grad_norm"] = self._apply_gradients(out.get("loss"))
        return out

    def _recomputed_loss(self, batch: RolloutTensors, sl: slice, inputs, old_lp, ref_lp, advantages, totals):
        """``--recompute-loss-function``: `_micro_batch_loss` of the model's logits under activation checkpointing:
        only the logits are kept, and the logits -> log-probs / entropy -> loss part (its ``[n, V]`` fp32
        log-softmax and the loss's temporaries) runs again in the backward. Same loss and gradients."""
        if self.routing is None:
            logits = model_forward(self.model, inputs.input_ids, inputs.attention_mask, inputs.vision)
        else:
            with self.routing.forward(self.model, sl, inputs):
                logits = model_forward(self.model, inputs.input_ids, inputs.attention_mask, inputs.vision)

        def loss_of(logits: torch.Tensor):
            self.loss_function_runs += 1
            lp, entropy = log_probs_from_logits(logits, inputs, temperature=self.cfg.rollout_temperature,
                                                with_entropy=True, chunk_size=self.cfg.log_probs_chunk_size)
            return self._micro_batch_loss(batch, sl, lp, entropy, old_lp, ref_lp, advantages, totals)

        return checkpoint(loss_of, logits, use_reentrant=False)

    @staticmethod
    def _step_totals(batch: RolloutTensors, gsl: slice) -> tuple[int, int]:
        """(samples, loss tokens) of one optimizer step: what every micro-batch's loss is divided by."""
        return gsl.stop - gsl.start, int(batch.loss_mask[gsl].sum().item())

    def _micro_batch_loss(self, batch: RolloutTensors, sl: slice, lp: torch.Tensor, entropy: torch.Tensor | None,
                          old_lp: torch.Tensor | None, ref_lp: torch.Tensor | None, advantages: torch.Tensor,
                          totals: tuple[int, int]) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """The policy loss of micro-batch ``sl`` (rows of the rollout) and its metric sums; shared by every backend.
        ``old_lp`` None: the old log-probs are this forward's, detached (kept in ``_step_old_lp``)."""
        dev = lp.device
        if old_lp is None:  # this forward is the old policy's (`_old_log_probs_from_step`)
            old_rows = lp.detach()
            self._step_old_lp[sl] = old_rows.to(self._step_old_lp.dtype).cpu()
            self._step_old_seen[sl] = True
        else:
            old_rows = old_lp[sl].to(dev)
        loss, m = policy_loss(
            self.algo,
            log_probs=lp,
            old_log_probs=old_rows,
            advantages=advantages[sl].to(dev),
            loss_mask=batch.loss_mask[sl].to(dev),
            ref_log_probs=None if ref_lp is None else ref_lp[sl].to(dev),
            rollout_log_probs=None if batch.rollout_log_probs is None else batch.rollout_log_probs[sl].to(dev),
            entropy=entropy,
            num_global_samples=totals[0],
            num_global_tokens=totals[1],
        )
        if fault_at("NAN_LOSS", self._step):
            loss = loss * float("nan")
        return loss, m

    def _policy_module(self) -> torch.nn.Module:
        """The policy as a plain module of the reference's structure (the Megatron backend's is inside its DDP). A
        method, not a property: the Megatron backend's first finishes a pending parameter gather, a collective."""
        return self.model

    @torch.no_grad()
    def _update_reference(self) -> None:
        """The reference model takes the actor's current weights (its frozen copy, as built at start)."""
        actor = self._policy_module()
        for ref, weight in zip(self.ref_model.parameters(), actor.parameters(), strict=True):
            ref.copy_(weight)
        for ref, weight in zip(self.ref_model.buffers(), actor.buffers(), strict=True):
            ref.copy_(weight)

    def _reset_optimizer_states(self) -> None:
        """``--reset-optimizer-states``: drop the optimizer's state, AdamW's moments and step counts or SGD's momentum
        (the actor's and the critic's); the next step starts them afresh, bias correction included."""
        for optimizer in (self.optimizer, self.critic.optimizer if self.critic is not None else None):
            if optimizer is not None:
                optimizer.state.clear()

    def _zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _apply_gradients(self, loss: float | None) -> float:
        """Sum the ranks' gradients, clip, refuse a non-finite gradient (before touching the weights), step;
        returns the grad norm."""
        params = list(self.master.params) if self.master is not None else [p for p in self.model.parameters()
                                                                              if p.requires_grad]
        self.dp.reduce_gradients(params)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, self.cfg.clip_grad)
        if not torch.isfinite(grad_norm):
            named = self.master.named_grads() if self.master is not None else (
                (n, p.grad) for n, p in self.model.named_parameters())
            raise nonfinite_gradient_error(named, float(grad_norm), loss)
        self.optimizer.step()
        if self.master is not None:
            self.master.copy_to_model()
        return float(grad_norm)

    # ------------------------------------------------------------------ --offload-train
    def _offloader(self):
        from relax.backends.torch.offload import TrainOffloader

        if self._train_offloader is None:
            critic = self.critic
            self._train_offloader = TrainOffloader(
                self.device, [self.model, self.master, self.ref_model, self.teacher, critic and critic.model,
                              self.old_actor and self.old_actor.model],
                [self.optimizer, critic and critic.optimizer])
        return self._train_offloader

    def offload(self) -> dict[str, float]:
        """Parameters, gradients, buffers and optimizer state to pinned CPU memory (a no-op on CPU)."""
        return self._offloader().offload().as_dict()

    def onload(self) -> dict[str, float]:
        """Everything `offload` moved goes back to the device, bitwise unchanged."""
        return self._offloader().onload().as_dict()

    # ------------------------------------------------------------------ weights
    def device_named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The weights under HF checkpoint names where they live (views, no copy): what the weight sync sends."""
        return [(name, t.detach()) for name, t in self.checkpoint_tensors().items()]

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The model's state under HF checkpoint names (MoE experts per expert; relax/models/checkpoint_names.py)."""
        return checkpoint_state(self.model.state_dict(), moe_style(self.model.config))

    def named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return [(name, t.cpu()) for name, t in self.device_named_tensors()]

    def weight_buckets(self, bucket_bytes: int) -> list[list[tuple[str, torch.Tensor]]]:
        """Split the weights (on their device) into buckets of at most ``bucket_bytes`` (one oversized tensor =
        its own bucket)."""
        buckets: list[list[tuple[str, torch.Tensor]]] = [[]]
        size = 0
        for name, tensor in self.device_named_tensors():
            nbytes = tensor.numel() * tensor.element_size()
            if buckets[-1] and size + nbytes > bucket_bytes:
                buckets.append([])
                size = 0
            buckets[-1].append((name, tensor))
            size += nbytes
        return buckets

    def checksums(self) -> dict[str, str]:
        return state_checksums(self.checkpoint_tensors().items())

    # ------------------------------------------------------------------ checkpoints
    def checkpoint_files(self, directory: str, *, save_optimizer: bool,
                         critic_directory: str | None = None) -> list[HostFile]:
        """The checkpoint's files as host copies (`relax.checkpoint_io`): what `save` writes, or ``--async-save``
        writes in the background while training goes on. The critic's go to ``critic_directory`` when given
        (``--critic-save``), else beside the actor's."""
        path = Path(directory)
        # safetensors refuses shared storage (tied embeddings): each name gets its own host copy.
        files = [HostFile(path / "model.safetensors", "safetensors", to_host(self.model.state_dict()))]
        if save_optimizer:
            files.append(HostFile(path / "optimizer.pt", "torch", to_host(self.optimizer.state_dict())))
        if self.master is not None:  # --bf16: the fp32 weights the optimizer steps (the model holds them rounded)
            files.append(HostFile(path / "master.safetensors", "safetensors", to_host(self.master.state())))
        if self.critic is not None:
            files += self.critic.checkpoint_files(Path(critic_directory) if critic_directory else path,
                                                  save_optimizer=save_optimizer)
        rng = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
        files.append(HostFile(path / "rng.pt", "torch", rng))
        return files

    def save(self, directory: str, *, save_optimizer: bool, critic_directory: str | None = None) -> None:
        write_files(self.checkpoint_files(directory, save_optimizer=save_optimizer,
                                          critic_directory=critic_directory))

    def load(self, directory: str, critic_directory: str | None = None) -> None:
        """Resume from ``directory``; the critic from ``critic_directory`` when given (``--critic-load``)."""
        from safetensors.torch import load_file

        path = Path(directory)
        state = load_file(str(path / "model.safetensors"))
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        if unexpected or missing:
            raise ValueError(f"checkpoint {path} does not match the model: missing={missing} unexpected={unexpected}")
        if self.master is not None:
            if not (path / "master.safetensors").exists():
                raise ValueError(f"checkpoint {path} has no master.safetensors: it was not saved with --bf16")
            self.master.load(load_file(str(path / "master.safetensors")))
        if (path / "optimizer.pt").exists():
            load_saved_state(self.optimizer, path / "optimizer.pt")
        if self.critic is not None:
            self.critic.load(Path(critic_directory) if critic_directory else path)
        if self.old_actor is not None:  # a resumed run's engines start from the loaded weights
            self.old_actor.refresh(self._policy_module())
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])

    def save_hf(self, directory: str) -> None:
        from relax.models import load_tokenizer, save_hf

        save_hf(self.model, load_tokenizer(self.cfg.hf_checkpoint), directory)

    def describe(self) -> dict[str, Any]:
        return {"num_params": sum(p.numel() for p in self.model.parameters()), "device": str(self.device),
                "frozen_params": len(self.frozen_params), "dtype": str(self.dtype).removeprefix("torch.")}
