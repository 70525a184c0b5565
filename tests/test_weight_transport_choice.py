"""The weight-sync transports' CPU-checkable parts: SGLang's flattened-bucket layout, the serialized
tensor payloads, the per-target transport choice and the flag rules.

The CUDA IPC hand-over itself needs two processes on one GPU: tests/gpu/test_weight_push_gpu.py.
"""

from __future__ import annotations

import base64
import pickle

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from relax.weights import serialized_tensors as payload
from relax.weights.transports import SyncTarget, choose
from tests.e2e_helpers import pretend_gpu_machine

MINIMAL = ["--train-backend", "megatron", "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]
GPU0, GPU1, HOST, OTHER_HOST = "cuda:GPU-0000@this-host", "cuda:GPU-1111@this-host", "cpu:this-host", "cpu:other-host"
GPU_ELSEWHERE = "cuda:GPU-2222@other-host"

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.uint8]
shapes = st.lists(st.integers(0, 5), min_size=0, max_size=3).map(tuple)


def _named(spec: list) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(0)
    return [(f"t{i}", (torch.randn(shape, generator=g) * 100).to(dtype)) for i, (shape, dtype) in enumerate(spec)]


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(shapes, st.sampled_from(DTYPES)), min_size=1, max_size=8))
def test_flatten_then_unflatten_gives_every_tensor_back_bitwise_in_sglang_layout(spec: list) -> None:
    named = payload.aligned_order(_named(spec))  # wider dtypes first: every view lands on an aligned offset
    flat, entries = payload.flatten_into(torch.empty(4096, dtype=torch.uint8), _named(spec))
    # SGLang's FlattenedTensorBucket: each tensor's uint8 view back to back, byte offsets, numel in bytes
    reference = torch.cat([t.flatten().view(torch.uint8) for _, t in named])
    assert torch.equal(flat, reference)
    at = 0
    for (name, t), e in zip(named, entries, strict=True):
        nbytes = t.numel() * t.element_size()
        assert (e.name, e.start_idx, e.end_idx, e.numel, e.dtype, tuple(e.shape)) == \
            (name, at, at + nbytes, nbytes, t.dtype, tuple(t.shape))
        at += nbytes
    for (_, a), (_, b) in zip(named, payload.unflatten(flat, entries), strict=True):
        assert a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def test_flatten_copies_so_later_training_does_not_change_a_sent_bucket() -> None:
    w = torch.ones(4)
    tied = [("embed", w), ("lm_head", w)]  # tied weights appear under both HF names
    flat, entries = payload.flatten_into(torch.empty(64, dtype=torch.uint8), tied)
    w.add_(1)
    assert all(torch.equal(t, torch.ones(4)) for _, t in payload.unflatten(flat, entries))
    with pytest.raises(ValueError, match="does not fit"):
        payload.flatten_into(torch.empty(8, dtype=torch.uint8), tied)


def test_the_tensor_transport_stages_a_host_buffer_before_anyone_reads_it() -> None:
    """Sharing a host buffer by name moves its bytes to a new segment; the trainer checksums a bucket on a
    thread while the transport encodes it, so the move must happen at `stage`, before both: encoding a
    staged bucket leaves its memory where it was (a CPU CI run checksummed half-moved bytes once)."""
    from relax.weights.transports import PackedBucket
    from relax.weights.transports.tensor import TensorTransport

    flat, entries = payload.flatten_into(torch.empty(64, dtype=torch.uint8), _named([((3, 4), torch.float32)]))
    bucket = PackedBucket(flat, tuple(entries), last=True)
    TensorTransport([], timeout_s=1).stage(bucket)
    staged = flat.data_ptr()
    payload.encode_flattened_bucket(flat, list(entries))
    assert flat.data_ptr() == staged


@pytest.mark.parametrize("load_format", [None, "direct", "flattened_bucket"])
def test_serialized_items_round_trip_in_every_sglang_load_format(load_format) -> None:
    named = _named([((3, 4), torch.float32), ((5,), torch.bfloat16), ((2, 2), torch.int64)])
    if load_format == "flattened_bucket":
        flat, entries = payload.flatten_into(torch.empty(256, dtype=torch.uint8), named)
        item = payload.encode_flattened_bucket(flat, entries)
        obj = payload.decode(item)
        assert all(type(m).__name__ == "SimpleNamespace" for m in obj["metadata"])  # what SGLang's unpickler admits
    else:
        item = payload.encode_named_tensors(named)
    out = dict(payload.named_tensors(payload.decode(item), load_format))
    assert list(out) == [n for n, _ in named] or load_format == "flattened_bucket"
    assert set(out) == {n for n, _ in named} and all(torch.equal(t, out[n]) for n, t in named)


@pytest.mark.parametrize(("item", "load_format", "message"), [
    ("%%%", None, "not base64"),
    (base64.b64encode(pickle.dumps(print)).decode(), None, "refers to builtins.print"),
    (base64.b64encode(b"not a pickle").decode(), None, "cannot be opened"),
    (payload.encode({"flattened_tensor": torch.zeros(4), "metadata": []}), "flattened_bucket", "1-D uint8"),
    (payload.encode([("a", 1)]), None, "list of .name, tensor. pairs"),
    (payload.encode([]), "safetensors", "load_format 'safetensors' is not implemented"),
])
def test_bad_payloads_are_refused_with_a_reason(item, load_format, message) -> None:
    with pytest.raises(ValueError, match=message):
        payload.named_tensors(payload.decode(item), load_format)


def test_flattened_metadata_outside_the_buffer_is_refused() -> None:
    flat = torch.zeros(8, dtype=torch.uint8)
    bad = payload.TensorEntry("w", torch.Size([4]), torch.float32, 0, 16, 16)
    with pytest.raises(ValueError, match="w lies outside"):
        payload.named_tensors(payload.decode(payload.encode_flattened_bucket(flat, [bad])), "flattened_bucket")


def _t(side: str, device: str, tp: int = 1, host_tensors: bool = False) -> SyncTarget:
    return SyncTarget(side, f"http://127.0.0.1/{side}", device, tp_size=tp, host_tensors=host_tensors)


def _ours(side: str, device: str, tp: int = 1) -> SyncTarget:
    """relax's engine: it copies a host buffer shared by name to its own device."""
    return _t(side, device, tp, host_tensors=True)


@pytest.mark.parametrize(("requested", "weights_at", "targets", "expected"), [
    ("auto", GPU0, [_t("e0", GPU0), _t("e1", GPU0)], {"tensor": ["e0", "e1"]}),  # colocate
    ("auto", GPU0, [_t("e0", GPU0), _t("e1", GPU1)], {"tensor": ["e0"], "distributed": ["e1"]}),  # other GPU: NCCL
    # a colocated TP engine (its first GPU holds the weights): its ranks open the same handle; elsewhere: broadcast
    ("auto", GPU0, [_t("e0", GPU0, tp=2), _t("e1", GPU1, tp=2)], {"tensor": ["e0"], "distributed": ["e1"]}),
    ("tensor", GPU0, [_t("e0", GPU0, tp=2)], {"tensor": ["e0"]}),
    ("auto", GPU0, [_t("e0", "unknown")], {"distributed": ["e0"]}),  # an external server that does not say
    ("auto", HOST, [_t("e0", GPU0)], {"distributed": ["e0"]}),  # offloaded trainer, a server that cannot map host memory
    # an offloaded colocate trainer (torch backend): relax's engines on this host's GPUs copy from shared memory;
    # one on another machine, or with two ranks, gets the broadcast
    ("auto", HOST, [_ours("e0", GPU0), _ours("e1", GPU1), _ours("e2", GPU_ELSEWHERE), _ours("e3", GPU0, tp=2)],
     {"tensor": ["e0", "e1"], "distributed": ["e2", "e3"]}),
    ("auto", HOST, [_ours("e0", HOST)], {"distributed": ["e0"]}),  # CPU runs keep gloo even for relax's engine
    ("auto", HOST, [_t("e0", HOST)], {"distributed": ["e0"]}),  # CPU runs: gloo
    ("tensor", HOST, [_t("e0", HOST)], {"tensor": ["e0"]}),  # forced: shared memory on one machine
    ("tensor", HOST, [_ours("e0", GPU0)], {"tensor": ["e0"]}),
    ("distributed", GPU0, [_t("e0", GPU0)], {"distributed": ["e0"]}),
])
def test_transport_choice_table(requested, weights_at, targets, expected) -> None:
    plan = choose(requested, weights_at, targets)
    assert {k: [t.side for t in v] for k, v in plan.items()} == expected


@pytest.mark.parametrize(("weights_at", "targets", "message"), [
    (GPU0, [_t("e1", GPU1)], "e1 is on cuda:GPU-1111@this-host but the trainer's weights are on cuda:GPU-0000"),
    (HOST, [_t("e1", OTHER_HOST)], "e1 is on cpu:other-host"),
    (HOST, [_ours("e3", GPU0, tp=2)], "e3 has 2 tensor-parallel ranks and its first GPU does not hold"),
    # host weights: a GPU server that cannot map host memory, or relax's engine on another machine
    (HOST, [_t("e0", GPU0)], "e0 is on cuda:GPU-0000@this-host but the trainer's weights are on cpu:this-host"),
    (HOST, [_ours("e2", GPU_ELSEWHERE)], "e2 is on cuda:GPU-2222@other-host"),
])
def test_forcing_tensor_where_memory_cannot_be_shared_names_both_sides(weights_at, targets, message) -> None:
    with pytest.raises(ValueError, match=message):
        choose("tensor", weights_at, targets)
    with pytest.raises(ValueError, match="unknown weight-sync transport 'object-store'"):
        choose("object-store", weights_at, targets)


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flag parsing as on the GPU machine: CUDA and megatron-core there (CPU CI has neither)."""
    pretend_gpu_machine(monkeypatch)


def test_flag_default_is_auto_and_tensor_is_accepted_for_megatron_colocate(gpu_machine) -> None:
    assert parse_args(MINIMAL).weight_sync_transport == "auto"
    args = parse_args([*MINIMAL, "--device", "cuda", "--colocate", "--weight-sync-transport", "tensor"])
    assert args.weight_sync_transport == "tensor"
    torch_colocate = [*MINIMAL, "--device", "cuda", "--colocate", "--train-backend", "torch"]
    assert parse_args([*torch_colocate, "--weight-sync-transport", "tensor"]).offload_train


@pytest.mark.parametrize(("flags", "message"), [
    (["--device", "cuda"], "needs --colocate"),
    # torch offloads: host weights, which only relax's engine maps into its GPU
    (["--device", "cuda", "--colocate", "--train-backend", "torch", "--rollout-backend", "sglang"],
     "with --offload-train and --rollout-backend sglang"),
])
def test_tensor_refusals(gpu_machine, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*MINIMAL, "--weight-sync-transport", "tensor", *flags])


def test_engine_errors_cross_process_boundaries_intact() -> None:
    """A trainer actor's push that fails on an engine raises in the driver as the same error (Ray pickles it)."""
    from relax.utils.http_utils import EngineError, EngineHTTPError

    for err in (EngineError("http://e:1", "cannot connect"), EngineHTTPError("http://e:1/x", 409, "released")):
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and str(back) == str(err) and back.url == err.url
    assert pickle.loads(pickle.dumps(EngineHTTPError("u", 400, "m"))).status == 400


def test_a_failed_send_names_the_unreachable_engine_before_one_that_answered() -> None:
    from relax.utils.http_utils import EngineError, EngineHTTPError
    from relax.weights.transports.distributed import DistributedTransport

    transport = DistributedTransport([], timeout_s=1)
    dead = EngineError("http://dead:1", "cannot connect (refused)")
    survivor = EngineHTTPError("http://alive:2", 409, "the sender gave up on this broadcast")
    collective = RuntimeError("Connection closed by peer")
    assert transport._engine_error([collective, survivor, dead]) is dead
    assert transport._engine_error([collective, survivor]) is survivor
    group = transport._engine_error([collective])
    assert isinstance(group, EngineError) and "RuntimeError: Connection closed by peer" in str(group)


def test_the_tensor_transport_gives_a_several_rank_engine_named_views_and_a_one_rank_engine_the_bucket(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang loads a flattened bucket where it lies, but moves each ``(name, tensor)`` pair to its rank's GPU first:
    an engine of several ranks gets pairs (SGLang's default format, one item per rank), a one-rank engine the bucket;
    both views of the same buffer, with the same bytes."""
    import asyncio

    from relax.engine.rollout import engine_client
    from relax.weights.transports import PackedBucket
    from relax.weights.transports.tensor import TensorTransport

    sent: dict[str, tuple] = {}

    class Recorder:
        def __init__(self, url: str, **_) -> None:
            self.url = url

        async def update_weights_from_tensor(self, items, *, load_format, flush_cache, weight_version):
            sent[self.url] = (items, load_format, flush_cache, weight_version)

    monkeypatch.setattr(engine_client, "EngineClient", Recorder)
    named = _named([((3, 4), torch.float32), ((5,), torch.bfloat16)])
    flat, entries = payload.flatten_into(torch.empty(256, dtype=torch.uint8), named)
    one, two = _t("e0", HOST), _t("e1", HOST, tp=2)
    asyncio.run(TensorTransport([one, two], timeout_s=1).send(PackedBucket(flat, tuple(entries), last=True), "7"))
    items, fmt, flush, version = sent[one.url]
    assert (len(items), fmt, flush, version) == (1, "flattened_bucket", True, "7")
    items, fmt, _, _ = sent[two.url]
    assert len(items) == 2 and items[0] == items[1] and fmt is None
    pairs = payload.named_tensors(payload.decode(items[0]), None)
    assert [n for n, _ in pairs] == [e.name for e in entries]
    assert all(torch.equal(t, dict(named)[n]) for n, t in pairs)


def test_a_tensor_parallel_servers_checksums_are_read_per_rank() -> None:
    """``/weights_checker checksum`` of an engine of two ranks: each rank's hashes under ``tp<r>/``, ranks ordered by
    their reported tp_rank; a rank count other than the engine's is an error naming it."""
    import asyncio

    from relax.engine.rollout.engine_client import EngineClient
    from relax.utils.http_utils import EngineError

    answer = {"ranks": [{"checksums": {"w": "b"}, "parallelism_info": {"tp_rank": 1}},
                        {"checksums": {"w": "a"}, "parallelism_info": {"tp_rank": 0}}]}

    class Client(EngineClient):
        async def weights_checker(self, action: str) -> dict:
            return answer

    client = Client("http://127.0.0.1:1")
    assert asyncio.run(client.sglang_checksums(2)) == {"tp0/w": "a", "tp1/w": "b"}
    with pytest.raises(EngineError, match=r"expected 1 rank\(s\)' checksums, got 2 ranks"):
        asyncio.run(client.sglang_checksums())

