"""The megatron-core training backend (``--train-backend megatron``): one rank of TP x PP x EP x DP.

It keeps the torch backend's contract, so the trainer actor, weight sync and checkpoints do not
care which backend runs: the RL step (`train_rollout`: old/ref/teacher log-probs, advantages,
the policy loss per micro-batch, metrics) is inherited from `TorchTrainBackend`; this class swaps
the model (this rank's part of a bf16 GPTModel, relax/backends/megatron/model.py, loaded slice by
slice from the HF weights, weights.py), runs the forward and backward passes through megatron-core's
pipeline schedules (schedule.py), steps megatron's optimizer (fp32 main params and Adam state,
optionally sharded over the data-parallel ranks with ``--use-distributed-optimizer``), gathers the
shards back into HF tensors for the sync, checksums and ``--save-hf`` (export.py), and checkpoints
with megatron-core's dist_checkpointing (checkpoint.py).

Every rank of the trainer group builds this class; the actor runs `train_rollout`, `load`, `save`,
`save_hf` and the weight export on every rank together (``collective_io``). Data-parallel ranks deal
micro-batches round-robin (`DataParallel` over megatron's data-parallel group); tensor-parallel ranks
run the same micro-batches; pipeline stages pass activations; the last stage computes the loss and
its log-probs and metrics are shared with the other stages. Freezing matches megatron-core
parameter names with global layer indices (``embedding``, ``output_layer``, ``decoder.layers.N``)
and runs before the DDP wrap, so frozen parameters get no grad buffer and no optimizer state.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.checkpoint import checkpoint

from relax.algorithms.reducers import merge_metrics
from relax.backends.config import TrainerConfig
from relax.backends.lr_schedule import LRSchedule
from relax.backends.megatron.async_save import AsyncSaves
from relax.backends.megatron.bridge import BridgeWeights
from relax.backends.megatron.config import McoreModelSpec
from relax.backends.megatron.fusions import fusion_kwargs, recompile_headroom, use_fused_torch_adam
from relax.backends.megatron.hf_source import open_hf_weights
from relax.backends.megatron.logprobs import response_log_probs_from_logits
from relax.backends.megatron.memory_flags import (
    make_embedding_output_differentiable,
    optimizer_offload_kwargs,
    recompute_kwargs,
)
from relax.backends.megatron.model import BuiltModel, build_gpt_model
from relax.backends.megatron.multi_tensor import install as install_foreach_multi_tensor
from relax.backends.megatron.offload import MegatronOffloader, torch_optimizers
from relax.backends.megatron.parallel import ParallelSizes, check_model_fits, init_parallel_state, rank_pos
from relax.backends.megatron.schedule import StageRunner
from relax.backends.megatron.sharding import global_name
from relax.backends.megatron.weights import ShardPlan, load_hf_weights
from relax.backends.nonfinite import nonfinite_gradient_error
from relax.backends.optimizer import ADAM_EPS
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import RolloutTensors, build_model_inputs
from relax.backends.torch.data_parallel import DataParallel
from relax.backends.torch.freezing import apply_param_freezing
from relax.checkpoint_io import write_files
from relax.distributed.resources import service_roles
from relax.models.provider import provider_mismatch
from relax.observability.collective_memory import checked
from relax.observability.memory import MemoryRecorder
from relax.observability.profiler import TrainProfiler
from relax.weights.checksum import state_checksums


def _frozen(built: BuiltModel) -> BuiltModel:
    built.module.eval().requires_grad_(False)
    return built


def _data_parallel() -> DataParallel:
    from megatron.core import parallel_state as ps

    return DataParallel(ps.get_data_parallel_rank(with_context_parallel=True),
                        ps.get_data_parallel_world_size(with_context_parallel=True),
                        ps.get_data_parallel_group(with_context_parallel=True))


class MegatronTrainBackend(TorchTrainBackend):
    """This rank's bf16 GPTModel (DDP-wrapped), its reference/teacher copies and the Megatron optimizer."""

    collective_io = True  # save / load / save_hf / weight export run on every rank together

    def __init__(self, cfg: TrainerConfig, device: str, *, service: str | None = None):
        self.cfg = cfg
        self.algo = cfg.algo
        mcfg = cfg.megatron
        self.sizes = ParallelSizes.of(mcfg)
        init_parallel_state(self.sizes, cfg.seed, backend="gloo" if device == "cpu" else "nccl",
                            timeout_minutes=mcfg.distributed_timeout_minutes)
        self.device = torch.device("cuda", torch.cuda.current_device()) if device != "cpu" else torch.device("cpu")
        self.dp = _data_parallel()
        torch.manual_seed(cfg.seed)
        self.hf_config, reader = open_hf_weights(cfg.hf_checkpoint, seed=cfg.seed)
        self.spec = McoreModelSpec.from_hf(self.hf_config, mcfg.model_name)
        check_model_fits(self.sizes, self.spec)
        self.fusions = fusion_kwargs(mcfg)
        recompile_headroom()  # before any compiled fusion runs (fusions.py)
        self._bridge = BridgeWeights(cfg.hf_checkpoint) if mcfg.megatron_to_hf_mode == "bridge" else None
        self._sync_loader = None
        if service is not None:
            self._init_service(reader, service)
            return
        layers_per_stage = self.spec.num_layers // self.sizes.pp
        policy_config = recompute_kwargs(mcfg, layers_per_stage)  # only the trainer recomputes
        if cfg.use_routing_replay:  # and only its routers replay (routing_replay.py)
            from relax.backends.megatron.routing_replay import replay_config

            policy_config.update(replay_config())
        self.built = self._initial_policy(reader, policy_config)
        self.plan = ShardPlan.of(self.built, self.sizes.layout, rank_pos())
        # with a `reference` service the frozen copy lives there, not here
        needs_ref = cfg.needs_reference_model and "reference" not in service_roles(cfg.resource)
        self.ref_model = _frozen(self._reference(reader)).module if needs_ref else None
        # --opd-type megatron: the teacher in this backend; sglang: its log-probs arrive with the samples
        self.teacher = self._teacher(reader) if cfg.use_opd and cfg.opd_type == "megatron" else None
        if cfg.keep_old_actor:  # the weights the engines generate with: one more copy in the policy's layout
            from relax.backends.torch.old_actor import OldActor

            self.old_actor = OldActor(self._initial_policy(reader).module, cfg.update_weights_interval)
        del reader
        self.frozen_params = apply_param_freezing(self.built.gpt, cfg.only_train_params_name_list,
                                                  cfg.freeze_params_name_list, rename=self._global_name,
                                                  across_ranks=_union_over_ranks)
        if mcfg.recompute_granularity == "full":  # a frozen embedding must not cut the checkpointed layers' grads
            make_embedding_output_differentiable(self.built.gpt)
        self.model, self.optimizer = self._wrap_for_training(self.built)
        self._train_moves = MegatronOffloader(self.model, self.optimizer, self.device)  # --offload-train
        self.schedule = LRSchedule.of(cfg)  # --lr-decay-style: train_rollout sets each step's rate in param_groups
        self.pad_id = int(getattr(self.hf_config, "pad_token_id", None) or 0)
        self.runner = StageRunner(self.sizes.tp if self.sizes.sequence_parallel else 1, self.pad_id, self.device)
        if cfg.use_routing_replay:  # the routing the policy's forwards replay (the inherited step drives it)
            from relax.backends.megatron.routing_replay import MegatronRoutingReplay
            from relax.models.moe_routing import routing_shape

            self.routing = MegatronRoutingReplay(self.built.gpt, routing_shape(self.hf_config),
                                                 from_rollout=cfg.use_rollout_routing_replay,
                                                 sequence_shards=self.runner.seq_multiple,
                                                 recomputes=mcfg.recompute_granularity == "full")
        self._step = 0
        self.critic = None
        if cfg.algo.advantage_estimator == "ppo":  # a plain torch value model, a full copy on every rank (critic.py)
            from relax.backends.torch.critic import Critic

            self.critic = Critic(cfg, self.device, self.pad_id, self.dp)
        self._exporter = None  # built on first use: every rank builds it (an all-gather of shapes)
        self._saves = AsyncSaves()  # --async-save: megatron-core's async saves in flight (async_save.py)
        self.profiler = TrainProfiler(cfg.profiler, rank=self.dp.rank)  # the inherited step's
        self.memory = MemoryRecorder(cfg.memory, rank=self.dp.rank)

    def _init_service(self, reader, service: str) -> None:
        """The forward-only copy a fully-async service runs (relax/backends/services.py), on a world of one: the
        policy's model (``actor_fwd``, in the policy's train mode) or the reference's, without grads, optimizer,
        teacher or critic. A weight sync's HF-named buckets go into its fused parameters (sync_loader.py)."""
        from relax.backends.megatron.sync_loader import SyncLoader

        if self.sizes.model_parallel * self.sizes.ep != 1 or self.dp.size != 1:
            raise ValueError(f"a {service} service runs one unsharded model, not {self.sizes} on {self.dp.size} ranks")
        self.built = _frozen(self._reference(reader)) if service == "reference" else self._initial_policy(reader)
        self.built.module.requires_grad_(False)
        self.model = self.built.module
        self.plan = ShardPlan.of(self.built, self.sizes.layout, rank_pos())
        self.ref_model = self.teacher = self.critic = self.optimizer = self.routing = self.old_actor = None
        self.frozen_params = []
        self.pad_id = int(getattr(self.hf_config, "pad_token_id", None) or 0)
        self.runner = StageRunner(1, self.pad_id, self.device)
        self._step = 0
        self._exporter = None
        self._sync_loader = SyncLoader(self.model, self.plan)

    def _build(self, spec: McoreModelSpec, extra_config: dict[str, Any] | None = None, *,
               provided: bool = False) -> BuiltModel:
        """``provided``: the policy's model (and its reference copy), from --custom-model-provider-path when set."""
        return build_gpt_model(spec, sizes=self.sizes, device=self.device.type,
                               attention_backend=self.cfg.attention_backend,
                               extra_config={**self.fusions, **(extra_config or {})},
                               provider_path=self.cfg.custom_model_provider_path if provided else None)

    def _load(self, reader, extra_config: dict[str, Any] | None = None) -> BuiltModel:
        """The policy (or its frozen reference copy) with ``--hf-checkpoint``'s weights (``--megatron-to-hf-mode``)."""
        built = self._build(self.spec, extra_config, provided=True)
        if self._bridge is not None:
            self._bridge.load(built)
        else:
            try:
                load_hf_weights(built, ShardPlan.of(built, self.sizes.layout, rank_pos()), reader)
            except ValueError as exc:
                if path := self.cfg.custom_model_provider_path:  # its names are not the checkpoint's layout
                    raise provider_mismatch(path, self.cfg.hf_checkpoint, exc) from None
                raise
        return built

    def _saved(self, reader, root: str, step: int | None, flag: str,
               extra_config: dict[str, Any] | None = None) -> BuiltModel:
        """The policy's model with the weights of a ``relax train --save`` directory's checkpoint of ``step``
        (``flag``; else its latest): a Megatron checkpoint, weights only, loaded under this run's layout whatever
        layout saved it (relax/backends/megatron/checkpoint.py). Every rank loads its shards (a collective)."""
        from relax import checkpoint as ckpt
        from relax.backends.megatron.checkpoint import load_checkpoint

        directory = (ckpt.find_step(root, step, flag=flag) if step is not None
                     else ckpt.find_latest(root, flag=flag, driver_state=False))
        built = self._load(reader, extra_config)
        load_checkpoint(directory, built.gpt, None, meta=self._meta())
        return built

    def _initial_policy(self, reader, extra_config: dict[str, Any] | None = None) -> BuiltModel:
        """The policy's model with its initial weights: ``--hf-checkpoint``'s or, without ``--load``, ``--ref-load``'s
        (seed 000: its initial checkpoint then): a relax checkpoint directory's step, or an HF model of its shape."""
        from relax.checkpoint import is_checkpoint_root

        ref_load = self.cfg.ref_load
        if not self.cfg.policy_from_ref_load:
            return self._load(reader, extra_config)
        if is_checkpoint_root(ref_load):
            return self._saved(reader, ref_load, self.cfg.ref_ckpt_step, "--ref-ckpt-step", extra_config)
        built = self._build(self.spec, extra_config, provided=True)  # always through the raw converter
        try:
            load_hf_weights(built, ShardPlan.of(built, self.sizes.layout, rank_pos()),
                            open_hf_weights(ref_load, seed=self.cfg.seed)[1])
            return built
        except (KeyError, ValueError) as exc:
            raise ValueError(f"--ref-load {ref_load}: not a model of --hf-checkpoint {self.cfg.hf_checkpoint}'s "
                             f"shape, and without --load the policy starts from it ({exc})") from None

    def _reference(self, reader) -> BuiltModel:
        """The reference: a copy of the initial policy (`_initial_policy`), or, when ``--load`` resumes the policy,
        ``--ref-load``'s model (a ``relax train --save`` directory's step of ``--ref-ckpt-step``, or another HF
        model with the policy's vocabulary)."""
        from relax.checkpoint import is_checkpoint_root

        ref_load = self.cfg.ref_load
        if self.cfg.reference_is_initial_policy:
            return self._initial_policy(reader)
        if is_checkpoint_root(ref_load):
            return self._saved(reader, ref_load, self.cfg.ref_ckpt_step, "--ref-ckpt-step")
        return self._other_model(ref_load, "--ref-load")

    def _teacher(self, reader):
        """The OPD teacher, frozen, in the student's parallel layout; from a ``relax train --save`` directory
        (``--opd-teacher-ckpt-step``), the policy's model with that step's weights."""
        from relax.checkpoint import is_checkpoint_root

        if is_checkpoint_root(self.cfg.opd_teacher_load):
            return _frozen(self._saved(reader, self.cfg.opd_teacher_load, self.cfg.opd_teacher_ckpt_step,
                                       "--opd-teacher-ckpt-step")).module
        return _frozen(self._other_model(self.cfg.opd_teacher_load, "--opd-teacher-load")).module

    def _other_model(self, path: str, flag: str) -> BuiltModel:
        """Another HF model (``flag``'s), its own shape but the policy's vocabulary (the log-probs it gives are of the
        same tokens), in this run's parallel layout, always through the raw converter."""
        config, reader = open_hf_weights(path, seed=self.cfg.seed)
        spec = McoreModelSpec.from_hf(config)
        if spec.vocab_size != self.spec.vocab_size:
            raise ValueError(f"{flag} {path}: vocab {spec.vocab_size} differs from the policy's {self.spec.vocab_size}")
        check_model_fits(self.sizes, spec)
        built = self._build(spec)
        load_hf_weights(built, ShardPlan.of(built, self.sizes.layout, rank_pos()), reader)
        return built

    def _global_name(self, name: str) -> str:
        return global_name(name, self.plan.wl, self.plan.par, self.plan.pos)

    def _wrap_for_training(self, built: BuiltModel):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        cfg = self.cfg
        mcfg = cfg.megatron
        distributed = bool(mcfg.use_distributed_optimizer)
        ddp = DistributedDataParallel(
            config=built.config,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True,
                                                     overlap_grad_reduce=bool(mcfg.overlap_grad_reduce),
                                                     overlap_param_gather=bool(mcfg.overlap_param_gather),
                                                     use_distributed_optimizer=distributed),
            module=built.module,
        )
        if mcfg.overlap_grad_reduce:  # as Megatron-LM wires it: no reduce until a bucket's last micro-batch
            built.config.no_sync_func = ddp.no_sync
            built.config.grad_sync_func = ddp.start_grad_sync  # align_grad_reduce: the pipeline's stages
        opt_config = OptimizerConfig(
            optimizer=cfg.optimizer, lr=cfg.lr, min_lr=cfg.lr, weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=ADAM_EPS, sgd_momentum=cfg.sgd_momentum,
            clip_grad=cfg.clip_grad, bf16=True, params_dtype=torch.bfloat16,
            use_distributed_optimizer=distributed,
            **optimizer_offload_kwargs(cfg.megatron),  # --optimizer-cpu-offload: megatron's HybridDeviceOptimizer
        )
        optimizer = get_megatron_optimizer(opt_config, [ddp])
        self.fused_adam = use_fused_torch_adam(optimizer) > 0
        self.foreach_multi_tensor = install_foreach_multi_tensor()  # grad norm / scale without per-tensor host reads
        return ddp, optimizer

    # ------------------------------------------------------------------ the RL step's passes, through megatron's schedules
    def _inputs(self, batch: RolloutTensors, slices: list[slice]):
        width = batch.loss_mask.shape[1]
        return [(sl, build_model_inputs(batch.samples[sl], width, self.pad_id, self.device)) for sl in slices]

    def _log_probs(self, logits: torch.Tensor, inputs, *, with_entropy: bool):
        return response_log_probs_from_logits(logits, inputs, vocab_size=self.spec.vocab_size,
                                              temperature=self.cfg.rollout_temperature, with_entropy=with_entropy,
                                              chunk_size=self.cfg.log_probs_chunk_size)

    @torch.no_grad()
    def _log_probs_no_grad(self, model: torch.nn.Module, batch: RolloutTensors) -> torch.Tensor:
        return self._log_probs_and_entropy_no_grad(model, batch, with_entropy=False)[0]

    @torch.no_grad()
    def _log_probs_and_entropy_no_grad(self, model: torch.nn.Module, batch: RolloutTensors, *,
                                       with_entropy: bool = True,
                                       part: tuple[int, int] | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``[N, T]`` response log-probs under ``model`` (and, ``with_entropy``, each token's entropy from the same
        logits: ``--use-rollout-entropy``) on every rank: this DP rank's micro-batches, summed over the
        data-parallel ranks, from the last pipeline stage. ``part`` ``(i, k)``: a service replica's micro-batches
        ``i, i + k, ...`` only; zeros elsewhere."""
        out = torch.zeros_like(batch.loss_mask)
        ent = torch.zeros_like(batch.loss_mask) if with_entropy else None
        slices = self._all_micro_batches(batch.samples, log_probs=True)
        micro = self._inputs(batch, slices if part is None else slices[part[0]::part[1]])

        def log_probs(rows, inputs, logits):
            lp, entropy = self._log_probs(logits, inputs, with_entropy=with_entropy)
            return lp.new_zeros(()), (lp, entropy)

        results = self.runner.run(model, micro, log_probs, forward_only=True, around=self._routing_of(model))
        for (sl, _), (lp, entropy) in zip(micro, results, strict=False):  # results only on the last stage
            out[sl] = lp.cpu()
            if ent is not None:
                ent[sl] = entropy.to(ent.dtype).cpu()
        return self._rows_everywhere(out), None if ent is None else self._rows_everywhere(ent)

    def _routing_of(self, model: torch.nn.Module):
        """``--use-routing-replay``: the policy's forwards replay or record their routing; other models route freely."""
        return self.routing.forward if self.routing is not None and model is self.model else None

    def _rows_everywhere(self, rows: torch.Tensor) -> torch.Tensor:
        """This DP rank's rows (filled on the last pipeline stage) -> the whole matrix on every rank."""
        return self.runner.from_last_stage(self.dp.sum_rows(rows))

    def _optimizer_step(self, batch: RolloutTensors, gsl: slice, old_lp: torch.Tensor | None, ref_lp: torch.Tensor | None,
                        advantages: torch.Tensor, micro: list[slice] | None = None) -> dict[str, float]:
        """One optimizer step over ``gsl`` through megatron-core's schedule; ``micro``: this rank's micro-batches
        (default: the usual split; the driver passes the ones it counted as consumed)."""
        micro = self._micro_batches(batch.samples, gsl) if micro is None else micro
        totals = self._step_totals(batch, gsl)
        self._zero_grad()

        def loss_of(rows, inputs, logits):
            lp, entropy = self._log_probs(logits, inputs, with_entropy=True)
            return self._micro_batch_loss(batch, rows, lp, entropy, old_lp, ref_lp, advantages, totals)

        def policy(rows, inputs, logits):
            if self.cfg.recompute_loss_function:  # only the logits are kept; the rest runs again in the backward
                loss, m = checkpoint(self._counted(loss_of), rows, inputs, logits, use_reentrant=False)
            else:
                loss, m = loss_of(rows, inputs, logits)
            return loss, {k: v.detach().cpu() for k, v in m.items()}

        sums: dict[str, torch.Tensor] = {}
        for metrics in self.runner.run(self.model, self._inputs(batch, micro), policy, forward_only=False,
                                       around=self._routing_of(self.model)):
            sums = merge_metrics(sums, metrics)
        if self.routing is not None:
            self.routing.end_update()
        out = {k: float(v) for k, v in self.dp.merge_metrics(sums).items()}
        out = self.runner.object_from_last_stage(out)
        out["grad_norm"] = self._apply_gradients(out.get("loss"))
        return out

    def _counted(self, fn):
        """``fn`` counting its runs in ``loss_function_runs`` (twice per micro-batch under recompute)."""
        def counted(*args):
            self.loss_function_runs += 1
            return fn(*args)
        return counted

    def _zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _policy_module(self) -> torch.nn.Module:
        """The GPTModel inside the DDP wrapper (megatron's DDP keeps its grad buffers in a ``buffers`` attribute,
        which hides ``nn.Module.buffers``), its weights gathered (`_finish_param_gather`)."""
        self._finish_param_gather()
        return self.built.module

    def _finish_param_gather(self) -> None:
        """``--overlap-param-gather`` leaves the all-gather of the optimizer's updated shards to the next forward's
        pre-hooks; whatever reads the weights otherwise (the sync's export and ``--save-hf``: `weight_buckets`; a
        checkpoint: `save`; the reference and old-actor copies: `_policy_module`) finishes it first, on every rank
        (a collective), as Megatron-LM's ``disable_forward_pre_hook(param_sync=True)`` does before it saves."""
        if self.cfg.megatron.overlap_param_gather:
            self.model.start_param_sync(force_sync=True)


    def _reset_optimizer_states(self) -> None:
        """``--reset-optimizer-states``: drop Adam's moments and step counts (SGD's momentum) in every torch optimizer
        megatron's wrappers hold (chained groups; with the distributed optimizer, this rank's fp32 shards); the next step
        starts them afresh, bias correction included. ``--optimizer-cpu-offload`` is refused with it."""
        for inner in torch_optimizers(self.optimizer):
            inner.state.clear()
        if self.critic is not None:  # the critic's plain torch optimizer, as the torch backend resets it
            self.critic.optimizer.state.clear()

    def _apply_gradients(self, loss: float | None) -> float:
        """Reduce grads over DP (and TP for sequence-parallel norms, PP for tied embeddings), refuse a non-finite
        gradient on any rank before any update, then Megatron's step (clipping to ``--clip-grad`` by the
        global norm, copying fp32 main params back to the bf16 model); returns that global norm."""
        from megatron.core.distributed import finalize_model_grads

        finalize_model_grads([self.model])
        named = [(n, p.main_grad) for n, p in self.model.named_parameters()
                 if p.requires_grad and p.main_grad is not None]
        local = float(torch.nn.utils.get_total_norm([g for _, g in named])) if named else 0.0  # fp32, foreach
        if not _finite_everywhere(local, self.device):
            raise nonfinite_gradient_error(named, local, loss)
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise FloatingPointError(f"Megatron optimizer skipped the step; loss was {loss}")
        if grad_norm is None or self.cfg.clip_grad <= 0:  # megatron reports the norm only when it clips
            grad_norm = self.optimizer.get_grad_norm()
        return float(grad_norm)

    # ------------------------------------------------------------------ --offload-train
    def offload(self) -> dict[str, float]:
        """The gradient buffers and the optimizer's fp32 state leave the GPU; the bf16 weights stay for the
        weight sync (relax/backends/megatron/offload.py)."""
        return self._train_moves.offload()

    def onload(self) -> dict[str, float]:
        return self._train_moves.onload()

    # ------------------------------------------------------------------ a service's copy (services.py)
    def forward_log_probs(self, samples, part: tuple[int, int] | None = None) -> torch.Tensor:
        if missing := self._sync_loader and self._sync_loader.incomplete():
            raise RuntimeError(f"a weight sync left {len(missing)} tensors unsent ({', '.join(missing[:3])}): "
                               "their fused parameters hold a mix of two versions")
        return super().forward_log_probs(samples, part)

    def load_weights(self, named_tensors: list[tuple[str, torch.Tensor]]) -> None:
        """One bucket of a weight sync (HF names) into the service's fused parameters."""
        if self._sync_loader is None:
            raise RuntimeError("only a service's copy of the Megatron model loads weight-sync buckets")
        self._sync_loader.load(named_tensors)

    def checkpoint_tensors(self) -> dict[str, torch.Tensor]:
        """The weights under HF checkpoint names (copies: qkv and gate/up are split out of the fused parameters)."""
        return self.hf_state()

    # ------------------------------------------------------------------ weights (HF names), every rank together
    def _export(self):
        from relax.backends.megatron.export import HFExporter

        if self._exporter is None:
            self._exporter = HFExporter(self.built, self.plan)
        return self._exporter

    def weight_buckets(self, bucket_bytes: int) -> Iterator[list[tuple[str, torch.Tensor]]]:
        """Full HF tensors on rank 0, bucket by bucket (empty buckets on the other ranks, which must iterate too)."""
        self._finish_param_gather()
        if self._bridge is not None:
            return self._bridge.buckets(self.built, bucket_bytes)
        return self._export().buckets(bucket_bytes)

    def hf_state(self) -> dict[str, torch.Tensor]:
        """Every full HF tensor on rank 0 (empty elsewhere). Holds the whole model: for tests and small models."""
        return {name: t for bucket in self.weight_buckets(1 << 62) for name, t in bucket}

    def device_named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.hf_state().items())

    def checksums(self) -> dict[str, str]:
        """Per-tensor checksums of the full HF tensors, on rank 0 (every rank takes part; ``{}`` elsewhere)."""
        named = [pair for bucket in self.weight_buckets(self.cfg.update_weight_buffer_size) for pair in bucket]
        return state_checksums(named) if named else {}

    # ------------------------------------------------------------------ checkpoints, sharded per rank
    def checkpoint_files(self, directory: str, *, save_optimizer: bool, critic_directory: str | None = None):
        """Never called: ``--async-save`` here is megatron-core's own async save (`save` with ``background``),
        every rank writing its shards, not host copies that rank 0 writes (the trainer actor picks by
        ``collective_io``)."""
        raise NotImplementedError("the Megatron backend saves in the background through save(background=True)")

    def save(self, directory: str, *, save_optimizer: bool, critic_directory: str | None = None,
             background: bool = False) -> None:
        """``background`` (``--async-save``): the shards are copied to host memory now and written while training
        goes on; `save_status` says when the checkpoint is complete (relax/backends/megatron/async_save.py). The
        PPO critic (the same on every rank) is written by rank 0 alone, to ``critic_directory`` when given
        (``--critic-save``), else beside the shards, before this returns, in both cases."""
        from relax.backends.megatron.checkpoint import save_checkpoint

        if save_optimizer and self.cfg.megatron.optimizer_cpu_offload:  # refused at parse time too (validation.py)
            raise RuntimeError("relax: not supported yet: saving the --optimizer-cpu-offload optimizer state "
                               "(save with --no-save-optim)")
        self._finish_param_gather()
        save_checkpoint(directory, self.built.gpt, self.optimizer, save_optimizer=save_optimizer, meta=self._meta(),
                        saves=self._saves if background else None)
        if self.critic is not None and dist.get_rank() == 0:
            write_files(self.critic.checkpoint_files(Path(critic_directory or directory), save_optimizer=save_optimizer))

    def save_status(self) -> str:
        """This rank's view of the background saves: ``running``, ``done`` or the failure's line (no collective:
        the driver polls it from another thread while a step trains)."""
        return self._saves.status()

    def finish_saves(self) -> str:
        """Wait for every background save and finalize it; every rank calls it at the same point."""
        return self._saves.finalize(blocking=True)

    def train_rollout(self, samples, step: int, precomputed=None) -> dict[str, float]:
        """Finalizes the background saves every rank has written (a collective: every rank is here), then
        trains the step."""
        self._saves.finalize(blocking=False)
        return super().train_rollout(samples, step, precomputed)

    def load(self, directory: str, critic_directory: str | None = None) -> None:
        from relax.backends.megatron.checkpoint import load_checkpoint

        load_checkpoint(directory, self.built.gpt, self.optimizer, meta=self._meta())
        if self.critic is not None:  # every rank: each holds the whole critic
            self.critic.load(Path(critic_directory or directory))
        if self.old_actor is not None:  # a resumed run's engines start from the loaded weights
            self.old_actor.refresh(self._policy_module())

    def _meta(self) -> dict:
        """What a checkpoint records about the run (relax/backends/megatron/checkpoint.py)."""
        sizes = self.sizes
        return {"distributed_optimizer": bool(self.cfg.megatron.use_distributed_optimizer), "tp": sizes.tp, "pp": sizes.pp,
                "ep": sizes.ep, "etp": sizes.etp, "dp": self.dp.size, "optimizer": self.cfg.optimizer}

    def save_hf(self, directory: str) -> None:
        from relax.backends.megatron.hf_export import write_hf_checkpoint

        write_hf_checkpoint(directory, self.weight_buckets(self.cfg.update_weight_buffer_size), self.hf_config,
                            self.cfg.hf_checkpoint, tied=self.spec.tie_word_embeddings)

    def describe(self) -> dict[str, Any]:
        sizes = self.sizes
        return {"num_params": sum(p.numel() for p in self.built.gpt.parameters()), "device": str(self.device),
                "backend": "megatron", "frozen_params": len(self.frozen_params),
                "layer_spec": "transformer_engine" if self.built.layout.fused_norms else "local",
                "fusions": sorted(k for k, on in self.fusions.items() if on), "fused_adam": self.fused_adam,
                "foreach_multi_tensor": self.foreach_multi_tensor,
                "parallel": {"tp": sizes.tp, "pp": sizes.pp, "ep": sizes.ep, "etp": sizes.etp, "dp": self.dp.size,
                             "sequence_parallel": sizes.sequence_parallel}}


def _union_over_ranks(used: set[str], trainable: int) -> tuple[set[str], int]:
    """The freezing patterns used and parameters trainable on any rank (every stage and expert range)."""
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return used, trainable
    everyone: list = [None] * dist.get_world_size()
    with checked("all_gather_object(frozen parameters)"):
        dist.all_gather_object(everyone, (sorted(used), trainable))
    return {p for names, _ in everyone for p in names}, sum(count for _, count in everyone)


def _finite_everywhere(local_norm: float, device: torch.device) -> bool:
    """Whether every rank's local gradient norm is finite (one all-reduce over the trainer group)."""
    bad = torch.tensor([0.0 if torch.isfinite(torch.tensor(local_norm)) else 1.0], device=device)
    if dist.is_initialized() and dist.get_world_size() > 1:
        with checked("all_reduce(gradient norm finite)"):
            dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    return not bool(bad.item())
