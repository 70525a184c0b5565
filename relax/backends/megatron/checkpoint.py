"""Megatron checkpoints sharded per rank: megatron-core ``dist_checkpointing``, resumable under other layouts.

``<iteration dir>/mcore/`` is one megatron-core distributed checkpoint (torch_dist format) written
by every rank at once: each parameter under its global name with its TP / PP / EP sharding
metadata, and (unless ``--no-save-optim``) the optimizer's step, parameter groups, fp32 main
params and Adam moments. With ``--use-distributed-optimizer`` the optimizer state is saved
``dp_reshardable`` (megatron-core's default: each rank writes its own contiguous slice of the
gradient buckets' state, which any other data-parallel size can read back; the tensor / pipeline
/ expert sizes must stay the same for it, while the model weights load under any layout). Saving and loading are spread over the data-parallel replicas
(megatron's fully-parallel strategy wrappers), so no rank reads or writes more than its share.
``<iteration dir>/rng/rank_NNNNN.pt`` holds each rank's RNG states (a rank the old run did not
have takes rank 0's), ``megatron.json`` what was saved (optimizer state or not, which optimizer, the
parallel sizes), so a resume that cannot use it is refused in one line instead of deep in megatron.
"""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from relax.backends.megatron.async_save import AsyncSaves

MCORE_DIR = "mcore"
RNG_DIR = "rng"
META_FILE = "megatron.json"
OPTIMIZER_SHARDING = {"distrib_optim_sharding_type": "dp_reshardable"}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _dp_group():
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group(with_context_parallel=True)


def _sharded(model, optimizer, *, with_optimizer: bool, is_loading: bool) -> dict:
    sharded = {"model": model.sharded_state_dict()}
    if with_optimizer:
        _init_adam_state(optimizer)
        _init_sgd_state(optimizer)
        sharded["optimizer"] = optimizer.sharded_state_dict(sharded["model"], is_loading=is_loading,
                                                            metadata=OPTIMIZER_SHARDING)
    return sharded


def save_checkpoint(directory: str | Path, model, optimizer, *, save_optimizer: bool, meta: dict,
                    saves: AsyncSaves | None = None) -> None:
    """Every rank writes its shards of ``model`` (this rank's GPTModel) and, optionally, ``optimizer``.

    ``meta``: what the run looks like (``distributed_optimizer``, parallel sizes), kept in ``megatron.json``.
    ``saves`` (``--async-save``): the shards are copied to host memory now and written in the background;
    the checkpoint is complete once ``saves`` has finalized it (relax/backends/megatron/async_save.py).
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    path = Path(directory)
    (path / MCORE_DIR).mkdir(parents=True, exist_ok=True)
    (path / RNG_DIR).mkdir(exist_ok=True)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), _dp_group())
    sharded = _sharded(model, optimizer, with_optimizer=save_optimizer, is_loading=False)
    if saves is None:
        dist_checkpointing.save(sharded, str(path / MCORE_DIR), sharded_strategy=strategy)
    else:  # megatron-core's own async writer ("nvrx", its default, needs nvidia-resiliency-ext, not installed)
        saves.schedule(dist_checkpointing.save(sharded, str(path / MCORE_DIR), sharded_strategy=strategy,
                                               async_sharded_save=True, async_strategy="mcore"))
    torch.save(_rng_state(), path / RNG_DIR / f"rank_{_rank():05d}.pt")
    if _rank() == 0:
        (path / META_FILE).write_text(json.dumps({**meta, "optimizer_state": save_optimizer}, indent=1))


MODEL_PARALLEL_KEYS = ("tp", "pp", "ep", "etp")


def load_checkpoint(directory: str | Path, model, optimizer, *, meta: dict) -> bool:
    """Load this rank's shards (any saved layout); the optimizer state too when the checkpoint has it.

    Returns whether it did; without it the optimizer's fp32 main params are refreshed from the loaded
    weights (a weights-only resume). ``optimizer=None`` loads the weights alone (``relax convert``: no RNG
    state either). ``meta``: this run's, as saved by `save_checkpoint`. Optimizer state
    saved with the other ``--use-distributed-optimizer`` setting, or the distributed optimizer's state
    under other model-parallel sizes (it reshards over data-parallel ranks only), is refused.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    path = Path(directory)
    mcore = path / MCORE_DIR
    if not (mcore / "metadata.json").exists() or not (path / META_FILE).exists():
        raise FileNotFoundError(f"{path}: no Megatron checkpoint ({MCORE_DIR}/metadata.json and {META_FILE})")
    saved = json.loads((path / META_FILE).read_text())
    with_optimizer = bool(saved["optimizer_state"]) and optimizer is not None
    if with_optimizer and saved.get("optimizer", "adam") != meta["optimizer"]:
        raise ValueError(f"{path}: the optimizer state was saved with --optimizer {saved.get('optimizer', 'adam')}, "
                         f"this run uses --optimizer {meta['optimizer']}; resume with the same setting")
    if with_optimizer and saved["distributed_optimizer"] != meta["distributed_optimizer"]:
        raise ValueError(f"{path}: the optimizer state was saved {'with' if saved['distributed_optimizer'] else 'without'}"
                         " --use-distributed-optimizer; resume with the same setting")
    if with_optimizer and saved["distributed_optimizer"] and any(saved[k] != meta[k] for k in MODEL_PARALLEL_KEYS):
        was = ", ".join(f"{k}={saved[k]}" for k in MODEL_PARALLEL_KEYS)
        raise ValueError(f"{path}: the distributed optimizer's state was saved with {was}; it reshards over data-parallel "
                         "ranks only: resume with those tensor / pipeline / expert sizes")
    strategy = FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(str(mcore)), _dp_group())
    state = dist_checkpointing.load(_sharded(model, optimizer, with_optimizer=with_optimizer, is_loading=True),
                                    str(mcore), sharded_strategy=strategy)
    model.load_state_dict(state["model"], strict=True)  # the GPTModel: its parameters are the DDP buffer's views
    if optimizer is None:
        return False
    if with_optimizer:
        with _adam_steps_set_aside(optimizer):
            optimizer.load_state_dict(state["optimizer"])
    else:
        optimizer.reload_model_params()
    rng = path / RNG_DIR / f"rank_{_rank():05d}.pt"
    _set_rng_state(torch.load(rng if rng.exists() else path / RNG_DIR / "rank_00000.pt", weights_only=False))
    return with_optimizer


def _torch_adams(optimizer) -> list:
    """The torch Adam/AdamW optimizers inside megatron's (chained) distributed optimizer (its fallback without TE/Apex)."""
    out = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        if hasattr(inner, "load_parameter_state_from_dp_reshardable") and isinstance(
                torch_opt, (torch.optim.Adam, torch.optim.AdamW)):
            out.append((inner, torch_opt))
    return out


def _init_adam_state(optimizer) -> None:
    """Give a never-stepped torch Adam its state (step 0, zero moments), as its first step would.

    Why: without Transformer Engine or Apex, megatron-core's `DistributedOptimizer.state_dict` reads the
    step from the per-parameter states (distrib_optimizer.py:836-840 in 0.19.2) and asserts there is
    exactly one, so building the sharded state dict to load into a fresh optimizer fails. The
    checkpoint then overwrites every one of these values.
    """
    for _, torch_opt in _torch_adams(optimizer):
        for group in torch_opt.param_groups:
            on_device = group.get("fused") or group.get("capturable")
            for p in group["params"]:
                state = torch_opt.state[p]
                if not state:
                    state["step"] = torch.zeros((), dtype=torch.float32, device=p.device if on_device else "cpu")
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)


def _init_sgd_state(optimizer) -> None:
    """Make megatron-core's (non-distributed) wrapper of a torch SGD (``--optimizer sgd``) able to save and load.

    Why: megatron-core 0.19.2 builds SGD with no ``init_state_fn``, and its mixed-precision wrapper calls that
    function when it builds the state dict to load into (optimizer.py:1146), and SGD makes its momentum buffers
    only at its first step, so a checkpoint written before one would lack what the load expects. Every wrapper
    gets a function that gives each parameter a zero momentum buffer, and gets those buffers now: torch's SGD
    steps a zero buffer as it steps a missing one (``0 * momentum + grad`` is the gradient itself).
    """
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        torch_opt = getattr(inner, "optimizer", None)
        if not isinstance(torch_opt, torch.optim.SGD):
            continue
        if getattr(inner, "init_state_fn", None) is None:
            inner.init_state_fn = _zero_momentum
        _zero_momentum(torch_opt)


def _zero_momentum(torch_opt, config=None) -> None:
    """A zero momentum buffer for each parameter of a momentum SGD that has none (megatron's ``init_state_fn``)."""
    for group in torch_opt.param_groups:
        if group["momentum"]:
            for p in group["params"]:
                state = torch_opt.state[p]
                if state.get("momentum_buffer") is None:
                    state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)


@contextlib.contextmanager
def _adam_steps_set_aside(optimizer):
    """Work around megatron-core's distributed-optimizer load without Transformer Engine or Apex.

    `DistributedOptimizer.load_state_dict` sets every torch Adam state's ``step`` from the checkpoint's
    parameter groups, then copies each parameter's saved state with `_set_main_param_and_optimizer_states`
    (0.19.2 distrib_optimizer.py:1193-1225), which copies every key of the live state, ``step`` included,
    from the saved one: there the step is absent (KeyError) or the value the loading rank had before
    the load (``dp_reshardable`` keeps it as a local object), which would undo the restored step. Here
    that copy runs without ``step`` on either side; the step stays the checkpoint's. Megatron also gives
    every parameter the same ``step`` tensor object, which a non-fused torch Adam (``step`` on the host)
    would then advance once per parameter per step; each gets its own copy after the load.
    """
    patched = []
    for inner, torch_opt in _torch_adams(optimizer):
        original = inner._set_main_param_and_optimizer_states

        def set_states(model_param, tensors, _original=original, _inner=inner, _opt=torch_opt):
            group_index, group_order = _inner.model_param_group_index_map[model_param]
            state = _opt.state[_opt.param_groups[group_index]["params"][group_order]]
            step = state.pop("step", None)
            try:
                _original(model_param, {k: v for k, v in tensors.items() if k != "step"})
            finally:
                if step is not None:
                    state["step"] = step

        inner._set_main_param_and_optimizer_states = set_states
        patched.append(inner)
    try:
        yield
    finally:
        for inner in patched:
            del inner._set_main_param_and_optimizer_states
        for _, torch_opt in _torch_adams(optimizer):
            for state in torch_opt.state.values():
                if "step" in state:
                    state["step"] = state["step"].clone()


def _rng_state() -> dict:
    from megatron.core import tensor_parallel

    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
        state["tracker"] = tensor_parallel.get_cuda_rng_tracker().get_states()
    return state


def _set_rng_state(state: dict) -> None:
    from megatron.core import tensor_parallel

    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
        tensor_parallel.get_cuda_rng_tracker().set_states(state["tracker"])
