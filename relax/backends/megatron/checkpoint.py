"""Megatron checkpoints sharded per rank: megatron-core ``dist_checkpointing``, resumable under other layouts.

``<iteration dir>/mcore/`` is one megatron-core distributed checkpoint (torch_dist format) written
by every rank at once: each parameter under its global name with its TP / PP / EP sharding
metadata, and (unless ``--no-save-optim``) the optimizer's step, parameter groups, fp32 main
params and Adam moments. With ``--use-distributed-optimizer`` the optimizer state is saved
``fully_sharded_model_space`` (each rank's flattened slice of each parameter's state, placed in the
parameter's own coordinates), which megatron-core loads under any data-parallel size, and under
other tensor / pipeline sizes too. Saving and loading are spread over the data-parallel replicas
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

MCORE_DIR = "mcore"
RNG_DIR = "rng"
META_FILE = "megatron.json"
OPTIMIZER_SHARDING = {"distrib_optim_sharding_type": "fully_sharded_model_space"}


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _dp_group():
    from megatron.core import parallel_state as ps

    return ps.get_data_parallel_group(with_context_parallel=True)


def _sharded(model, optimizer, *, with_optimizer: bool, is_loading: bool) -> dict:
    sharded = {"model": model.sharded_state_dict()}
    if with_optimizer:
        sharded["optimizer"] = optimizer.sharded_state_dict(sharded["model"], is_loading=is_loading,
                                                            metadata=OPTIMIZER_SHARDING)
    return sharded


def save_checkpoint(directory: str | Path, model, optimizer, *, save_optimizer: bool, meta: dict) -> None:
    """Every rank writes its shards of ``model`` (the DDP-wrapped GPTModel) and, optionally, ``optimizer``.

    ``meta``: what the run looks like (``distributed_optimizer``, parallel sizes), kept in ``megatron.json``.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_save_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelSaveStrategyWrapper

    path = Path(directory)
    (path / MCORE_DIR).mkdir(parents=True, exist_ok=True)
    (path / RNG_DIR).mkdir(exist_ok=True)
    strategy = FullyParallelSaveStrategyWrapper(get_default_save_sharded_strategy(), _dp_group())
    dist_checkpointing.save(_sharded(model, optimizer, with_optimizer=save_optimizer, is_loading=False),
                            str(path / MCORE_DIR), sharded_strategy=strategy)
    torch.save(_rng_state(), path / RNG_DIR / f"rank_{_rank():05d}.pt")
    if _rank() == 0:
        (path / META_FILE).write_text(json.dumps({**meta, "optimizer_state": save_optimizer}, indent=1))


def load_checkpoint(directory: str | Path, model, optimizer, *, distributed_optimizer: bool) -> bool:
    """Load this rank's shards (any saved layout); the optimizer state too when the checkpoint has it.

    Returns whether it did; without it the optimizer's fp32 main params are refreshed from the loaded
    weights (a weights-only resume). Optimizer state saved with the other ``--use-distributed-optimizer``
    setting is refused.
    """
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.serialization import get_default_load_sharded_strategy
    from megatron.core.dist_checkpointing.strategies.fully_parallel import FullyParallelLoadStrategyWrapper

    path = Path(directory)
    mcore = path / MCORE_DIR
    if not (mcore / "metadata.json").exists() or not (path / META_FILE).exists():
        raise FileNotFoundError(f"{path}: no Megatron checkpoint ({MCORE_DIR}/metadata.json and {META_FILE})")
    meta = json.loads((path / META_FILE).read_text())
    with_optimizer = bool(meta["optimizer_state"])
    if with_optimizer and bool(meta["distributed_optimizer"]) != distributed_optimizer:
        raise ValueError(f"{path}: the optimizer state was saved {'with' if meta['distributed_optimizer'] else 'without'}"
                         " --use-distributed-optimizer; resume with the same setting")
    strategy = FullyParallelLoadStrategyWrapper(get_default_load_sharded_strategy(str(mcore)), _dp_group())
    state = dist_checkpointing.load(_sharded(model, optimizer, with_optimizer=with_optimizer, is_loading=True),
                                    str(mcore), sharded_strategy=strategy)
    model.load_state_dict(state["model"], strict=True)
    if with_optimizer:
        with _adam_steps_set_aside(optimizer):
            optimizer.load_state_dict(state["optimizer"])
    else:
        optimizer.reload_model_params()
    rng = path / RNG_DIR / f"rank_{_rank():05d}.pt"
    _set_rng_state(torch.load(rng if rng.exists() else path / RNG_DIR / "rank_00000.pt", weights_only=False))
    return with_optimizer


@contextlib.contextmanager
def _adam_steps_set_aside(optimizer):
    """Work around megatron-core 0.19.2's distributed-optimizer load without Transformer Engine or Apex.

    `DistributedOptimizer.load_state_dict` first puts a ``step`` tensor into every torch Adam state
    (distrib_optimizer.py:1024-1032, its non-TE path), then `load_parameter_state_from_fs_model_space`
    copies every key of that state from the checkpoint (``_set_main_param_and_optimizer_states``,
    :1222), which holds no per-parameter ``step``: a KeyError. The step is restored from the
    parameter groups already; here each distributed optimizer's parameter-state load runs with the
    ``step`` entries taken out and put back after.
    """
    patched = []
    for inner in getattr(optimizer, "chained_optimizers", [optimizer]):
        load = getattr(inner, "load_parameter_state_from_fs_model_space", None)
        if load is None:  # not a distributed optimizer
            continue

        def without_steps(state_dict, _load=load, _inner=inner):
            states = [s for s in _inner.optimizer.state.values() if "step" in s]
            steps = [s.pop("step") for s in states]
            try:
                _load(state_dict)
            finally:
                for s, step in zip(states, steps, strict=True):
                    s["step"] = step

        inner.load_parameter_state_from_fs_model_space = without_steps
        patched.append(inner)
    try:
        yield
    finally:
        for inner in patched:
            del inner.load_parameter_state_from_fs_model_space


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
