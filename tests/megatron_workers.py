"""Run megatron-core in several worker processes: on CPU over gloo (with shims), or one CUDA GPU per rank over NCCL.

megatron-core hard-codes CUDA in places a CPU run passes through (``device="cuda"`` tensors in its
schedules and optimizers, ``torch.cuda.current_device()`` for buffers, the CUDA RNG tracker,
``param.type() == 'torch.cuda.BFloat16Tensor'`` checks, ``torch.cuda.synchronize`` in pipeline
p2p). `install_cpu_shims` redirects exactly those to the CPU inside a spawned test worker (never in
the pytest process itself); the tensor-parallel, pipeline and expert-parallel maths and their
collectives are megatron's own, over gloo. `spawn` runs a function on N such workers and returns
rank 0's result (a failure on any rank fails the test with that rank's traceback); ``cuda=True``
runs them on GPUs 0..N-1 over NCCL instead, with no shims (the multi-GPU tests).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

_FACTORIES = ("zeros", "tensor", "empty", "ones", "full", "arange", "zeros_like", "empty_like", "ones_like", "randn")


def _cpu(device):
    if isinstance(device, torch.device):
        return "cpu" if device.type == "cuda" else device
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return "cpu"
    return device


class _Stream:
    """A CUDA stream stand-in: CPU work is already ordered."""

    def __init__(self, *args, **kwargs):
        pass

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        return self  # an "event" whose synchronize() returns at once

    def __eq__(self, other) -> bool:
        return isinstance(other, _Stream)

    __hash__ = object.__hash__


def install_cpu_shims() -> None:
    """Point megatron-core's hard-coded CUDA uses at the CPU (worker processes only)."""
    for name in _FACTORIES:
        original = getattr(torch, name)

        def factory(*args, _original=original, **kwargs):
            if "device" in kwargs:
                kwargs["device"] = _cpu(kwargs["device"])
            return _original(*args, **kwargs)

        setattr(torch, name, factory)
    original_type = torch.Tensor.type

    def tensor_type(self, *args, **kwargs):  # megatron's optimizers accept only 'torch.cuda.*Tensor' params
        if args or kwargs:
            return original_type(self, *args, **kwargs)
        name = original_type(self)
        return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)

    torch.Tensor.type = tensor_type
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    torch.nn.Module.cuda = lambda self, *args, **kwargs: self
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    torch.cuda.set_device = lambda *args, **kwargs: None
    torch.cuda.Stream = _Stream  # MoE's alltoall dispatcher copies token counts on a side stream
    torch.cuda.current_stream = lambda *args, **kwargs: _Stream()
    torch.cuda.stream = lambda *args, **kwargs: contextlib.nullcontext()
    torch.Tensor.record_stream = lambda self, stream: None
    from megatron.core import tensor_parallel

    tracker = tensor_parallel.get_cuda_rng_tracker()
    tracker.fork = lambda *args, **kwargs: contextlib.nullcontext()  # dropout is 0; no CUDA RNG on CPU
    tracker.add = lambda *args, **kwargs: None
    import megatron.core.tensor_parallel.random as mrandom  # full recompute saves and restores the CUDA RNG state

    mrandom._get_cuda_rng_state = lambda *args, **kwargs: None
    mrandom._set_cuda_rng_state = lambda *args, **kwargs: None
    import megatron.core.transformer.moe.moe_utils as moe_utils
    import megatron.core.transformer.moe.token_dispatcher as token_dispatcher

    def to_host(tensor, as_numpy: bool = False, record_stream: bool = False):  # on CUDA the split sizes become numpy
        return tensor.numpy() if as_numpy and torch.is_tensor(tensor) else tensor

    token_dispatcher.maybe_move_tensor_to_cpu = to_host
    if not hasattr(moe_utils, "te_general_gemm"):  # megatron-core 0.16 leaves the name undefined without TE
        moe_utils.te_general_gemm = None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, fn, args: tuple, queue, cuda: bool) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    try:
        if cuda:
            torch.cuda.set_device(rank)
        else:
            install_cpu_shims()
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world)
        result = fn(rank, *args)
        payload = io.BytesIO()  # bytes, not shared-memory tensors: the worker exits before the parent reads
        torch.save(result if rank == 0 else None, payload)
        queue.put((rank, "ok", payload.getvalue()))
    except BaseException:  # noqa: BLE001 - reported to the parent with the traceback
        queue.put((rank, "error", traceback.format_exc()))
    finally:
        from megatron.core import parallel_state

        parallel_state.destroy_model_parallel()
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn, world: int, *args, timeout: float = 600, cuda: bool = False):
    """Run ``fn(rank, *args)`` on ``world`` workers (gloo CPU with megatron's shims, or NCCL GPUs); rank 0's result."""
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_worker, args=(r, world, port, fn, args, queue, cuda)) for r in range(world)]
    for p in procs:
        p.start()
    results, errors = {}, []
    try:
        for _ in range(world):
            rank, status, payload = queue.get(timeout=timeout)
            if status == "error":
                errors.append(f"rank {rank}:\n{payload}")
                break
            results[rank] = torch.load(io.BytesIO(payload), weights_only=False)
    finally:
        for p in procs:
            p.join(timeout=5 if errors else 60)
            if p.is_alive():
                p.kill()
    if errors:
        raise AssertionError("\n".join(errors))
    return results[0]
