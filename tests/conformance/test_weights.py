"""The weight endpoints driven by relax's own senders (`TensorTransport`, `DistributedTransport`, `EngineClient`),
then read back through ``/model_info`` and ``/weights_checker``. Each check leaves the checkpoint's weights served."""

from __future__ import annotations

import pytest
import torch

from relax.engine.rollout.engine_client import EngineClient, EngineHTTPError
from relax.utils.http_utils import run_closing
from relax.weights import serialized_tensors
from relax.weights.transports.base import PackedBucket, SyncTarget
from relax.weights.transports.distributed import DistributedTransport
from relax.weights.transports.tensor import TensorTransport
from tests.conformance.target import Target, endpoints

PROMPT = [5, 6, 7, 8]
RANK_KEYS = {"checksums", "per_gpu_checksum", "parallelism_info"}


def client(target: Target) -> EngineClient:
    return EngineClient(target.url, control_timeout=120.0, weights_timeout=120.0)


def served_version(target: Target) -> str:
    status, info = target.call("GET", "/model_info")
    assert status == 200
    return info["weight_version"]


def generated_version(target: Target) -> str:
    status, answer = target.call("POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    assert status == 200, answer
    return answer["meta_info"]["weight_version"]


def bucket(target: Target, device: torch.device) -> PackedBucket:
    named = target.hf_state()
    size = sum(t.numel() * t.element_size() for _, t in named)
    flat, entries = serialized_tensors.flatten_into(torch.empty(size, dtype=torch.uint8, device=device), named)
    return PackedBucket(flat, tuple(entries), last=True)


def reload(target: Target, version: int) -> dict:
    answer = run_closing(client(target).update_weights_from_disk(str(target.model_dir), weight_version=version))
    assert answer["success"] is True and isinstance(answer["message"], str), answer
    assert isinstance(answer.get("num_paused_requests"), int), f"update_weights_from_disk answer keys {sorted(answer)}"
    return answer


@endpoints("/update_weights_from_disk", "/model_info", "/generate")
def test_update_weights_from_disk(target: Target) -> None:
    reload(target, 8)
    assert served_version(target) == "8" and generated_version(target) == "8"
    status, answer = target.call("POST", "/update_weights_from_disk", {"model_path": str(target.model_dir / "absent")})
    assert status == 400 and answer["success"] is False, f"a missing checkpoint answered {status}: {answer}"


@endpoints("/update_weights_from_tensor", "/model_info", "/generate")
def test_update_weights_from_tensor_as_the_trainer_sends(target: Target) -> None:
    """`TensorTransport`: one flattened bucket (CUDA IPC against a GPU server, shared memory against a CPU one)."""
    device = torch.device("cuda" if target.live else "cpu")
    packed = bucket(target, device)
    transport = TensorTransport([SyncTarget("engine:0", target.url)], timeout_s=120.0)
    transport.stage(packed)
    run_closing(transport.send(packed, "7"))
    assert served_version(target) == "7" and generated_version(target) == "7"
    name, tensor = target.hf_state()[-1]  # SGLang's direct format: (name, tensor) pairs, no version
    item = serialized_tensors.encode_named_tensors([(name, tensor.to(device))])
    answer = run_closing(client(target).update_weights_from_tensor([item]))
    assert answer["success"] is True and isinstance(answer["message"], str), answer
    assert served_version(target) == "7"


@endpoints("/init_weights_update_group", "/update_weights_from_distributed", "/destroy_weights_update_group",
           "/model_info")
def test_distributed_sync_as_the_trainer_sends(target: Target) -> None:
    """`DistributedTransport`: gloo against a CPU server; NCCL against a GPU one (from another GPU: NCCL refuses
    two ranks on one device)."""
    if target.live and torch.cuda.device_count() < 2:
        pytest.skip("NCCL needs the sender on a GPU other than the server's; this machine has one")
    device = torch.device(f"cuda:{torch.cuda.device_count() - 1}" if target.live else "cpu")
    packed = bucket(target, device)
    transport = DistributedTransport([SyncTarget("engine:0", target.url)], timeout_s=120.0)

    async def sync() -> None:
        await transport.open(device)
        try:
            await transport.send(packed, "9")
        finally:
            await transport.close()

    run_closing(sync())
    assert served_version(target) == "9" and generated_version(target) == "9"
    status, answer = target.call("POST", "/destroy_weights_update_group", {"group_name": "conformance-absent"})
    assert status == 400 and answer["success"] is False, f"destroying an unknown group answered {status}: {answer}"


@endpoints("/weights_checker", "/update_weights_from_disk")
def test_weights_checker_actions(target: Target) -> None:
    c = client(target)
    for action in ("snapshot", "compare"):
        answer = run_closing(c.weights_checker(action))
        assert answer["success"] is True and set(answer) == {"success", "message"}, f"{action}: {answer}"
    assert run_closing(c.weights_checker("reset_tensors"))["success"] is True
    with pytest.raises(EngineHTTPError) as refused:
        run_closing(c.weights_checker("compare"))
    assert refused.value.status == 400, f"compare after reset_tensors answered {refused.value.status}"
    reload(target, 10)
    assert run_closing(c.weights_checker("compare"))["success"] is True, "compare after reloading the checkpoint"
    for method, body in (("POST", {"action": "checksum"}), ("GET", None)):
        status, answer = target.call(method, "/weights_checker", body)
        assert status == 200 and answer["success"] is True, f"{method} checksum: {status} {answer}"
        assert isinstance(answer.get("ranks"), list) and len(answer["ranks"]) == 1, f"ranks {answer.get('ranks')!r}"
        assert isinstance(answer.get("per_engine_checksum"), str)
        (rank,) = answer["ranks"]
        assert set(rank) == RANK_KEYS and rank["parallelism_info"]["tp_size"] == 1, f"rank keys {sorted(rank)}"
    assert ("checksums" in answer) is not target.live, "top-level checksums: the embedded engine's extension"
    status, answer = target.call("POST", "/weights_checker", {"action": "explode"})
    assert status == 400 and answer["success"] is False and "explode" in answer["message"], answer


@endpoints("/release_memory_occupation", "/resume_memory_occupation", "/update_weights_from_disk", "/generate")
def test_release_and_resume_everything_then_sync(target: Target) -> None:
    if target.live:
        status, info = target.call("GET", "/server_info")
        if not info.get("enable_memory_saver"):
            pytest.skip("the live server runs without --enable-memory-saver")
    c = client(target)
    assert run_closing(c.release_memory_occupation()) is None
    assert run_closing(c.resume_memory_occupation()) is None
    reload(target, 11)  # the weights' memory came back without their values (no CPU backup)
    assert generated_version(target) == "11"
