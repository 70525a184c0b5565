"""The megatron-core training backend (``--train-backend megatron``), one GPU for now.

It keeps the torch backend's contract, so the trainer actor, weight sync and checkpoints do
not care which backend runs: the RL step (`train_rollout`: old/ref/teacher log-probs,
advantages, policy loss, micro-batch accumulation) is inherited from `TorchTrainBackend`
unchanged; this class swaps the model (a bf16 GPTModel built from the HF config and loaded
with the HF weights through the raw converter), the forward (`mcore_response_log_probs`),
and the optimizer (megatron-core's, fp32 main params, optionally the distributed optimizer),
and exports HF-named weights for the sync and the checksums. Dynamic batching, chunked
log-probs and parameter freezing come with the inherited step; freezing matches megatron-core
parameter names (``embedding``, ``output_layer``, ``decoder.layers.N...``) and runs before the
DDP wrap, so frozen parameters get no grad buffer and no optimizer state.

Precision: bf16 weights and activations, fp32 gradients (Megatron DDP buffers), fp32 Adam
state and main params. The initial weights are the HF model that ``--hf-checkpoint`` names
(a preset with ``--seed``, or a directory), so torch and Megatron runs start from the same
weights up to the bf16 cast.
"""

from __future__ import annotations

import random
from argparse import Namespace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from relax.algorithms import AlgorithmConfig
from relax.backends.megatron.config import McoreModelSpec
from relax.backends.megatron.fusions import fusion_kwargs, use_fused_torch_adam
from relax.backends.megatron.logprobs import mcore_response_log_probs
from relax.backends.megatron.memory_flags import (
    make_embedding_output_differentiable,
    optimizer_offload_kwargs,
    recompute_kwargs,
)
from relax.backends.megatron.model import BuiltModel, build_gpt_model, init_parallel_state
from relax.backends.megatron.weights import export_hf_state, load_hf_state
from relax.backends.nonfinite import nonfinite_gradient_error
from relax.backends.torch.backend import TorchTrainBackend, needs_reference_model
from relax.backends.torch.data_parallel import DataParallel
from relax.backends.torch.freezing import apply_param_freezing
from relax.models import build_model
from relax.weights.checksum import state_checksums

# Megatron-LM's non-distributed checkpoint layout: optimizer.pt holds the step and the param groups,
# this file the distributed optimizer's per-parameter state (fp32 main params, Adam moments).
DIST_OPTIMIZER_STATE = "distrib_optim.pt"


def _frozen(built: BuiltModel) -> BuiltModel:
    built.module.eval().requires_grad_(False)
    return built


class MegatronTrainBackend(TorchTrainBackend):
    """Owns the bf16 GPTModel (DDP-wrapped), its reference/teacher copies and the Megatron optimizer."""

    def __init__(self, args: Namespace, device: str):
        self.args = args
        init_parallel_state(args.seed)
        self.dp = DataParallel()  # one rank (trainer groups are torch-backend only: validation.py)
        self.device = torch.device("cuda", torch.cuda.current_device())
        torch.manual_seed(args.seed)
        hf_model = build_model(args.hf_checkpoint, dtype=torch.float32, seed=args.seed)
        self.hf_config = hf_model.config
        self.spec = McoreModelSpec.from_hf(hf_model.config)
        hf_state = hf_model.state_dict()
        del hf_model
        self.fusions = fusion_kwargs(args)
        self.built = self._load(hf_state, recompute_kwargs(args, self.spec.num_layers))  # only the trainer recomputes
        self.ref_model = _frozen(self._load(hf_state)).module if needs_reference_model(args) else None
        self.teacher = None
        if args.use_opd:
            teacher_hf = build_model(args.opd_teacher_load, dtype=torch.float32, seed=args.seed)
            if teacher_hf.config.vocab_size != self.spec.vocab_size:
                raise ValueError(f"--opd-teacher-load {args.opd_teacher_load}: vocab {teacher_hf.config.vocab_size} "
                                 f"differs from the student's {self.spec.vocab_size}")
            teacher = build_gpt_model(McoreModelSpec.from_hf(teacher_hf.config), extra_config=self.fusions)
            load_hf_state(teacher, teacher_hf.state_dict(), mode=args.megatron_to_hf_mode)
            self.teacher = _frozen(teacher).module
        del hf_state
        self.frozen_params = apply_param_freezing(self.built.gpt, args)
        if args.recompute_granularity == "full":  # a frozen embedding must not cut the checkpointed layers' grads
            make_embedding_output_differentiable(self.built.gpt)
        self.model, self.optimizer = self._wrap_for_training(self.built)
        self.algo = AlgorithmConfig.from_args(args)
        self.pad_id = int(getattr(self.hf_config, "pad_token_id", None) or 0)
        self._step = 0
        self.critic = None  # --advantage-estimator ppo is refused for this backend at parse time

    def _load(self, hf_state: dict[str, torch.Tensor], extra_config: dict[str, Any] | None = None) -> BuiltModel:
        built = build_gpt_model(self.spec, extra_config={**self.fusions, **(extra_config or {})})
        load_hf_state(built, hf_state, mode=self.args.megatron_to_hf_mode)
        return built

    def _wrap_for_training(self, built: BuiltModel):
        from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
        from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

        args = self.args
        distributed = bool(args.use_distributed_optimizer)
        ddp = DistributedDataParallel(
            config=built.config,
            ddp_config=DistributedDataParallelConfig(grad_reduce_in_fp32=True, overlap_grad_reduce=False,
                                                     use_distributed_optimizer=distributed),
            module=built.module,
        )
        opt_config = OptimizerConfig(
            optimizer="adam", lr=args.lr, min_lr=args.lr, weight_decay=args.weight_decay,
            adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=1e-8,
            clip_grad=args.clip_grad, bf16=True, params_dtype=torch.bfloat16,
            use_distributed_optimizer=distributed,
            **optimizer_offload_kwargs(args),  # --optimizer-cpu-offload: megatron's HybridDeviceOptimizer
        )
        optimizer = get_megatron_optimizer(opt_config, [ddp])
        self.fused_adam = use_fused_torch_adam(optimizer) > 0
        return ddp, optimizer

    # ------------------------------------------------------------------ hooks of the shared RL step
    def _forward_log_probs(self, model: torch.nn.Module, inputs, *, with_entropy: bool):
        return mcore_response_log_probs(model, inputs, temperature=self.args.rollout_temperature,
                                        with_entropy=with_entropy, chunk_size=self.args.log_probs_chunk_size)

    def _zero_grad(self) -> None:
        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _apply_gradients(self, loss: float | None) -> float:
        """Reduce grads (a world of one), refuse non-finite ones before any update, then Megatron's step
        (clipping to ``--clip-grad`` and copying fp32 main params back to the bf16 model)."""
        self.model.finish_grad_sync()
        named = [(n, p.main_grad) for n, p in self.model.named_parameters()
                 if p.requires_grad and p.main_grad is not None]
        grad_norm = float(torch.nn.utils.get_total_norm([g for _, g in named]))  # fp32 grads, foreach kernels
        if not np.isfinite(grad_norm):
            raise nonfinite_gradient_error(named, grad_norm, loss)
        ok, _, _ = self.optimizer.step()
        if not ok:
            raise FloatingPointError(f"Megatron optimizer skipped the step; loss was {loss}")
        return grad_norm

    # ------------------------------------------------------------------ --offload-train
    def offload(self) -> dict[str, float]:
        # The DDP param/grad buffers and the (distributed) optimizer's fp32 shards are views into
        # flat buffers; moving them needs the buffers themselves moved. Refused at parse time too.
        raise NotImplementedError("not supported yet: --offload-train with --train-backend megatron")

    onload = offload

    # ------------------------------------------------------------------ weights (HF names)
    def hf_state(self) -> dict[str, torch.Tensor]:
        return export_hf_state(self.built, mode=self.args.megatron_to_hf_mode)

    def device_named_tensors(self) -> list[tuple[str, torch.Tensor]]:
        return list(self.hf_state().items())

    def checksums(self) -> dict[str, str]:
        return state_checksums(self.hf_state().items())

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str, *, save_optimizer: bool) -> None:
        from safetensors.torch import save_file

        if save_optimizer and self.args.optimizer_cpu_offload:  # refused at parse time too (validation.py)
            raise RuntimeError("relax: not supported yet: saving the --optimizer-cpu-offload optimizer state "
                               "(save with --no-save-optim)")
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.cpu().contiguous().clone() for k, v in self.hf_state().items()}, str(path / "model.safetensors"))
        if save_optimizer:
            torch.save(self.optimizer.state_dict(), path / "optimizer.pt")
            if self.args.use_distributed_optimizer:  # its Adam moments and fp32 main params live in the shards
                self.optimizer.save_parameter_state(str(path / DIST_OPTIMIZER_STATE))
        rng = {"torch": torch.get_rng_state(), "cuda": torch.cuda.get_rng_state(), "numpy": np.random.get_state(),
               "python": random.getstate()}
        torch.save(rng, path / "rng.pt")

    def load(self, directory: str) -> None:
        from safetensors.torch import load_file

        path = Path(directory)
        load_hf_state(self.built, load_file(str(path / "model.safetensors")), mode=self.args.megatron_to_hf_mode)
        self.optimizer.reload_model_params()  # the fp32 main params follow the loaded weights
        if (path / "optimizer.pt").exists():
            sharded = (path / DIST_OPTIMIZER_STATE).exists()
            if sharded != bool(self.args.use_distributed_optimizer):
                raise ValueError(f"{path}: the optimizer state was saved {'with' if sharded else 'without'} "
                                 "--use-distributed-optimizer; resume with the same setting")
            self.optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=False))
            if sharded:
                self._load_parameter_state(path / DIST_OPTIMIZER_STATE)
        rng = torch.load(path / "rng.pt", weights_only=False)
        torch.set_rng_state(rng["torch"])
        torch.cuda.set_rng_state(rng["cuda"])
        np.random.set_state(rng["numpy"])
        random.setstate(rng["python"])

    def _load_parameter_state(self, file: Path) -> None:
        """megatron-core's `load_parameter_state`, with torch Adam's per-parameter ``step`` set aside meanwhile.

        Without TE or Apex, `DistributedOptimizer.load_state_dict` puts a ``step`` tensor into every torch
        Adam state, and `load_parameter_state_from_dp_zero` (0.19.2, distrib_optimizer.py:1217-1224) then
        copies every tensor of that state from the saved shards, which hold no ``step``: a KeyError. The
        step is already restored by `load_state_dict`; only the shards' tensors come from ``file``.
        """
        inner = [getattr(o, "optimizer", None) for o in getattr(self.optimizer, "chained_optimizers", [self.optimizer])]
        steps = [(state, state.pop("step")) for opt in inner if opt is not None
                 for state in opt.state.values() if "step" in state]
        try:
            self.optimizer.load_parameter_state(str(file))
        finally:
            for state, step in steps:
                state["step"] = step

    def save_hf(self, directory: str) -> None:
        from relax.models import load_tokenizer, save_hf

        model = build_model(self.args.hf_checkpoint, dtype=torch.bfloat16, seed=self.args.seed)
        model.load_state_dict({k: v.cpu() for k, v in self.hf_state().items()}, strict=True)
        save_hf(model, load_tokenizer(self.args.hf_checkpoint), directory)

    def describe(self) -> dict[str, Any]:
        return {"num_params": sum(p.numel() for p in self.built.gpt.parameters()), "device": str(self.device),
                "backend": "megatron", "frozen_params": len(self.frozen_params),
                "layer_spec": "transformer_engine" if self.built.layout.fused_norms else "local",
                "fusions": sorted(k for k, on in self.fusions.items() if on), "fused_adam": self.fused_adam}
