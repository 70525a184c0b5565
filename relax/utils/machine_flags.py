"""Flags that need a CUDA GPU, checked against the machine before any other rule.

A launch script written for a GPU cluster (seed 004's) run on a machine without a GPU gets one
line per GPU-only flag, each naming the missing GPU, and nothing else about those flags: each
refused flag is reset to its default, so the not-supported gate and the cross-flag rules that
follow do not report it a second time.

Megatron-only flags count as GPU flags while the backend is megatron (the seed's default); with an
explicit ``--train-backend torch`` they conflict with that choice and validation.py says so.
``--train-backend megatron`` is the seed's default. When it was not asked for (no flag, preset or
config file names a backend) and there is no GPU, the run trains with ``--train-backend torch``
and says so in a notice (printed at start, kept in run.json): the seeds' scripts never name a
backend, and the torch backend runs the same RL step on the CPU. Asked for explicitly, it is
refused like the other GPU-only flags.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable, Set
from typing import Any

from relax.utils.flag_table import FLAGS, FLAGS_BY_NAME
from relax.utils.flag_types import Problems


def _more_than_one(value: Any) -> bool:
    return value is not None and value > 1


# dest -> (does this value need a GPU, why)
GPU_FLAGS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "tensor_model_parallel_size": (_more_than_one, "tensor parallelism splits each layer over that many GPUs"),
    "pipeline_model_parallel_size": (_more_than_one, "pipeline parallelism puts layer stages on that many GPUs"),
    "context_parallel_size": (_more_than_one, "context parallelism splits sequences over that many GPUs"),
    "expert_model_parallel_size": (_more_than_one, "expert parallelism puts experts on that many GPUs"),
    "expert_tensor_parallel_size": (_more_than_one, "expert tensor parallelism splits experts over GPUs"),
    "sequence_parallel": (bool, "sequence parallelism shards activations over tensor-parallel GPUs"),
    "rollout_num_gpus_per_engine": (_more_than_one, "an engine over several GPUs (SGLang's tp_size)"),
    "sglang_mem_fraction_static": (lambda v: v is not None, "the share of GPU memory an SGLang engine takes"),
    "attention_backend": (lambda v: v in ("flash", "fused"), "flash and fused attention are CUDA kernels"),
    "weight_sync_transport": (lambda v: v == "cuda-ipc", "CUDA IPC shares GPU memory between processes"),
    "record_memory_history": (bool, "the CUDA allocator's history"),
    "memory_snapshot_num_steps": (lambda v: v is not None, "a snapshot of the CUDA allocator"),
    "enable_cuda_memory_check": (bool, "it reads a CUDA device's free memory around each collective"),
}
# with --memory-recorder memray these record the host's memory, which every machine has
HOST_MEMORY_FLAGS = ("record_memory_history", "memory_snapshot_num_steps")
_MEGATRON_WHY = "a --train-backend megatron flag, and megatron-core runs on CUDA GPUs only"


def _megatron_flags() -> dict[str, Callable[[Any], bool]]:
    from relax.backends.megatron.checks import MEGATRON_ONLY_FLAGS
    from relax.backends.megatron.memory_flags import MEMORY_FLAGS

    flags: dict[str, Callable[[Any], bool]] = {dest: lambda v: v not in (None, False)
                                               for dest in (*MEMORY_FLAGS, *MEGATRON_ONLY_FLAGS)}
    flags["megatron_to_hf_mode"] = lambda v: v == "bridge"
    return flags


def _megatron_parallel_flags() -> tuple[str, ...]:
    """Parallel layouts only Megatron builds: with another backend they conflict with it, not the machine."""
    from relax.backends.megatron.checks import MEGATRON_ONLY_FLAGS, PARALLEL_SIZE_FLAGS

    return (*PARALLEL_SIZE_FLAGS, *MEGATRON_ONLY_FLAGS)


def _value_text(dest: str, value: Any) -> str:
    flag = "--" + dest.replace("_", "-")
    return flag if value is True else f"{flag} {value}"


def has_gpu(args: Namespace) -> bool:
    """Whether this run has a CUDA GPU: ``--device cpu`` never, ``--device cuda`` by request (setup checks
    the device exists), ``auto`` when torch sees one."""
    if args.device != "auto":
        return args.device == "cuda"
    from relax.backends.megatron import checks  # its probe, which tests of GPU-only parsing patch

    return checks._cuda_available()


def _requests_gpus(args: Namespace) -> bool:
    resource = args.resource if isinstance(args.resource, dict) else {}
    return any(isinstance(v, list) and len(v) == 2 and isinstance(v[1], int | float) and v[1] > 0
               for v in resource.values())


def check_machine(args: Namespace, given: Set[str], p: Problems) -> None:
    """Refuse GPU-only flags on a machine without a GPU (one line each, then reset); resolve the backend default."""
    megatron = args.train_backend == "megatron"
    wanted = {dest: why for dest, (needs, why) in GPU_FLAGS.items()
              if needs(getattr(args, dest)) and (megatron or dest not in _megatron_parallel_flags())
              and not (dest in HOST_MEMORY_FLAGS and args.memory_recorder == "memray")}
    # with an explicit torch backend a Megatron flag conflicts with the backend, not the machine (validation.py)
    megatron_flags = {dest for dest, needs in _megatron_flags().items() if needs(getattr(args, dest))} if megatron \
        else set()
    if not (wanted or megatron_flags or megatron or _requests_gpus(args)) or has_gpu(args):
        return
    where = "--device cpu uses none" if args.device == "cpu" else "this machine has none"
    if megatron and "train_backend" in given:
        p.add(f"--train-backend megatron needs a CUDA GPU ({where}): megatron-core does not run on CPU; "
              "use --train-backend torch")
    elif megatron:
        args.notices.append("the default --train-backend megatron needs a CUDA GPU and " + where
                            + ": training with --train-backend torch (pass it to silence this notice)")
    if megatron:
        args.train_backend = "torch"
    for dest in megatron_flags:
        wanted.setdefault(dest, _MEGATRON_WHY)
    order = {spec.dest: i for i, spec in enumerate(FLAGS)}
    for dest, why in sorted(wanted.items(), key=lambda item: order[item[0]]):  # table order
        p.add(f"{_value_text(dest, getattr(args, dest))} needs a CUDA GPU ({why}); {where}")
        setattr(args, dest, FLAGS_BY_NAME[dest.replace("_", "-")].default)
    if _requests_gpus(args):
        _cpu_resources(args, where)


def _cpu_resources(args: Namespace, where: str) -> None:
    """--resource GPU counts on a run without GPUs. Joining a cluster, they are still reserved (a cluster may
    declare GPUs its CPU actors are placed by); alone, every role gets its replicas, each on the CPU."""
    from relax.distributed.cluster import cluster_address
    from relax.distributed.resources import parse_roles

    parse_roles(args.resource)  # the request as written is checked first (a malformed role is named as given)
    if cluster_address(args.ray_address) is not None:
        args.notices.append(f"--resource counts GPUs, and {where}: every role runs on the CPU (the cluster's GPUs "
                            "are still reserved to place the actors)")
        return
    args.resource = {role: [v[0], 0] if isinstance(v, list) and len(v) == 2 else v for role, v in args.resource.items()}
    args.notices.append(f"--resource counts GPUs, and {where}: every role runs on the CPU, one actor per replica")
