"""The colocate CUDA-IPC sync's CPU-checkable parts: packing, per-target transport choice, flag rules.

The IPC hand-over itself needs two processes on one GPU: tests/gpu/test_cuda_ipc_sync_gpu.py.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from relax.weights.broadcast import WeightReceiver
from relax.weights.cuda_ipc import CudaIpcBucket, FlatBucket, device_identity
from relax.weights.sync import choose_transports
from tests.e2e_helpers import pretend_gpu_machine

MINIMAL = ["--train-backend", "megatron", "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]
GPU0, GPU1 = "cuda:GPU-0000", "cuda:GPU-1111"

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(shapes, st.sampled_from(DTYPES)), min_size=1, max_size=8))
def test_pack_then_unpack_gives_every_tensor_back_bitwise(spec: list) -> None:
    g = torch.Generator().manual_seed(0)
    named = [(f"t{i}", (torch.randn(shape, generator=g) * 100).to(dtype)) for i, (shape, dtype) in enumerate(spec)]
    flat = FlatBucket.pack(named)
    assert len(flat.buffers) == len({t.dtype for _, t in named})  # one buffer per dtype
    assert flat.nbytes == sum(t.numel() * t.element_size() for _, t in named)
    out = flat.unpack()
    assert [name for name, _ in out] == [name for name, _ in named]
    for (_, a), (_, b) in zip(named, out, strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_pack_copies_so_later_training_does_not_change_a_sent_bucket() -> None:
    w = torch.ones(4)
    tied = [("embed", w), ("lm_head", w)]  # tied weights appear under both HF names
    flat = FlatBucket.pack(tied)
    w.add_(1)
    assert all(torch.equal(t, torch.ones(4)) for _, t in flat.unpack())


def test_a_pool_makes_consecutive_buckets_share_one_buffer_per_dtype() -> None:
    pool: dict = {}
    first = FlatBucket.pack([("a", torch.arange(6.0)), ("b", torch.ones(2, dtype=torch.bfloat16))], pool=pool)
    second = FlatBucket.pack([("c", torch.full((4,), 7.0))], pool=pool)  # smaller: a prefix of the same buffer
    assert first.buffers[0].untyped_storage().data_ptr() == second.buffers[0].untyped_storage().data_ptr()
    assert dict(second.unpack())["c"].tolist() == [7.0] * 4
    bigger = FlatBucket.pack([("d", torch.zeros(10))], pool=pool)  # grows: a new buffer, kept for later buckets
    assert pool[torch.float32].numel() == 10 and bigger.buffers[0].numel() == 10
    assert set(pool) == {torch.float32, torch.bfloat16}


def test_host_buckets_pass_through_and_cpu_tensors_cannot_be_shared() -> None:
    bucket = [("w", torch.zeros(2))]
    assert WeightReceiver("cpu").tensors(bucket) == bucket
    with pytest.raises(ValueError, match="needs the trainer's weights on a CUDA device"):
        CudaIpcBucket.share(FlatBucket.pack(bucket))
    assert device_identity("cpu") == "cpu"


@pytest.mark.parametrize(("requested", "weights_at", "targets", "snapshot", "expected"), [
    ("auto", GPU0, [GPU0, GPU0], False, ["cuda-ipc", "cuda-ipc"]),  # colocate: every engine on the trainer's GPU
    ("auto", GPU0, [GPU0, GPU1], False, ["cuda-ipc", "broadcast"]),  # an engine on another GPU: NCCL
    ("auto", GPU0, [GPU1, "cpu"], False, ["broadcast", "object-store"]),
    ("broadcast", GPU0, [GPU1, GPU1], False, ["broadcast", "broadcast"]),
    ("broadcast", "cpu", ["cpu"], False, ["broadcast"]),  # gloo on the host
    ("broadcast", GPU0, [GPU1], True, ["object-store"]),
    ("auto", "cpu", [GPU0], False, ["object-store"]),  # an offloaded trainer: weights on the host
    ("auto", "cpu", ["cpu"], False, ["object-store"]),  # CPU runs
    ("auto", GPU0, [GPU0], True, ["object-store"]),  # fault tolerance keeps host bytes
    ("object-store", GPU0, [GPU0], False, ["object-store"]),
    ("cuda-ipc", GPU0, [GPU0, GPU0], False, ["cuda-ipc", "cuda-ipc"]),
    ("auto", GPU0, [], False, []),
])
def test_transport_choice_table(requested, weights_at, targets, snapshot, expected) -> None:
    assert choose_transports(requested, weights_at, targets, keep_snapshot=snapshot) == expected


def test_forcing_cuda_ipc_across_gpus_names_both_devices() -> None:
    with pytest.raises(RuntimeError, match=f"target is on {GPU1}, but the trainer's weights are on {GPU0}"):
        choose_transports("cuda-ipc", GPU0, [GPU0, GPU1], keep_snapshot=False)
    with pytest.raises(RuntimeError, match=f"broadcast: a sync target is on {GPU0} and the trainer's weights on {GPU0}"):
        choose_transports("broadcast", GPU0, [GPU1, GPU0], keep_snapshot=False)  # NCCL: two ranks on one GPU
    with pytest.raises(RuntimeError, match="broadcast: a sync target is on cpu"):
        choose_transports("broadcast", GPU0, ["cpu"], keep_snapshot=False)
    with pytest.raises(ValueError, match="unknown weight-sync transport 'nccl'"):
        choose_transports("nccl", GPU0, [GPU0], keep_snapshot=False)


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag parsing as on the GPU machine: CUDA and megatron-core there (CPU CI has neither)."""
    pretend_gpu_machine(monkeypatch)


def test_flag_default_is_auto_and_cuda_ipc_is_accepted_for_megatron_colocate(gpu_machine) -> None:
    assert parse_args(MINIMAL).weight_sync_transport == "auto"
    args = parse_args([*MINIMAL, "--colocate", "--weight-sync-transport", "cuda-ipc"])
    assert args.weight_sync_transport == "cuda-ipc"


@pytest.mark.parametrize(("flags", "message"), [
    ([], "needs --colocate"),
    (["--colocate", "--use-fault-tolerance"], "with --use-fault-tolerance"),
    (["--colocate", "--use-fault-tolerance", "--weight-sync-transport", "broadcast"], "broadcast with --use-fault"),
    (["--colocate", "--train-backend", "torch"], "with --offload-train"),  # torch colocate offloads the trainer
])
def test_cuda_ipc_refusals(gpu_machine, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*MINIMAL, "--weight-sync-transport", "cuda-ipc", *flags])
