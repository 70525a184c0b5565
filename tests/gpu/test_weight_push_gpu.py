"""The trainer's weight push to an engine server process on a GPU, through SGLang's endpoints.

* ``tensor``: /update_weights_from_tensor with CUDA IPC handles to the pusher's packed GPU buffer (the
  colocate sync): the engine process maps the buffer and copies device to device. Three syncs with
  the weights changed in between prove the reused buffer is never read stale, and a resync from the
  host snapshot lands bitwise too.
* ``tensor`` from host weights (an offloaded colocate trainer, the torch backend): a named shared-memory segment
  that the engine maps and copies to its GPU, chosen by ``auto`` for relax's engine.
* ``distributed`` (two GPUs): /init_weights_update_group + /update_weights_from_distributed over NCCL
  to an engine on the other GPU.
"""

from __future__ import annotations

import os

import pytest
import torch

from relax.backends.embedded.launch import EngineProcess
from relax.engine.rollout.engine_client import EngineClient
from relax.models import build_model
from relax.utils.http_utils import run_closing
from relax.weights.checksum import state_checksums
from relax.weights.devices import device_identity
from relax.weights.push import WeightPusher
from relax.weights.transports import SyncTarget

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _engine(gpu: int) -> EngineProcess:
    """An engine server on this process's ``gpu``-th visible GPU (the physical one, under CUDA_VISIBLE_DEVICES)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    env = {"CUDA_VISIBLE_DEVICES": visible.split(",")[gpu].strip() if visible else str(gpu)}
    return EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--device", "cuda", "--dtype", "bfloat16"],
                               env=env)


def _target(proc: EngineProcess, host_tensors: bool = False) -> SyncTarget:
    info = run_closing(EngineClient(proc.url).server_info())
    return SyncTarget("engine:0", proc.url, info["relax_engine"]["device"], host_tensors=host_tensors)


def _weights(device: str) -> dict[str, torch.Tensor]:
    state = build_model("tiny-qwen3", dtype=torch.bfloat16, seed=5).to(device).state_dict()
    state["model.norm.weight"] = state["model.norm.weight"].float()  # a second dtype in the same bucket
    return state


def _buckets(state: dict) -> list:
    items = list(state.items())
    return [items[: len(items) // 2], items[len(items) // 2:]]


def test_cuda_ipc_push_is_bitwise_across_syncs_and_resyncs() -> None:
    proc = _engine(0)
    pusher = WeightPusher(timeout_s=120)
    try:
        target = _target(proc)
        assert target.device == device_identity("cuda:0")  # the same GPU (by UUID) in both processes
        state = _weights("cuda:0")
        state["model.norm.weight"] = state["model.norm.weight"].bfloat16()  # the engine holds bf16
        for version in range(1, 4):
            report = pusher.push(_buckets(state), [target], version, requested="tensor",
                                 weights_device=torch.device("cuda:0"), keep_snapshot=True)
            assert report.transports == {"tensor": ["engine:0"]}
            assert report.target_checksums["engine:0"] == report.trainer_checksums == state_checksums(state.items())
            for t in state.values():  # an optimizer step: the next push refills the same buffer
                t.add_(1)
        proc2 = _engine(0)
        try:
            resynced = pusher.resync([_target(proc2)])
            assert resynced.target_checksums["engine:0"] == pusher.snapshot.trainer_checksums
            assert run_closing(EngineClient(proc2.url).weight_version()) == 3
        finally:
            proc2.stop()
    finally:
        pusher.close()
        proc.stop()


def test_host_weights_reach_a_gpu_engine_through_shared_memory_bitwise() -> None:
    """What an offloaded torch trainer sends at each colocate sync: ``auto`` picks the shared segment (not a gloo
    broadcast) for relax's engine on a GPU of this host, and every version lands bitwise."""
    proc = _engine(0)
    pusher = WeightPusher(timeout_s=120)
    try:
        target = _target(proc, host_tensors=True)
        state = {k: v.bfloat16() for k, v in _weights("cpu").items()}
        for version in range(1, 4):
            report = pusher.push(_buckets(state), [target], version, requested="auto",
                                 weights_device=torch.device("cpu"))
            assert report.transports == {"tensor": ["engine:0"]}
            assert report.target_checksums["engine:0"] == state_checksums(state.items())
            for t in state.values():
                t.mul_(0.5).add_(1)
    finally:
        pusher.close()
        proc.stop()


@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_nccl_push_reaches_an_engine_on_another_gpu_bitwise() -> None:
    proc = _engine(1)
    pusher = WeightPusher(timeout_s=120)
    try:
        target = _target(proc)
        assert target.device != device_identity("cuda:0")
        state = {k: v.bfloat16() for k, v in _weights("cuda:0").items()}
        for version in range(1, 4):
            report = pusher.push(_buckets(state), [target], version, requested="auto",
                                 weights_device=torch.device("cuda:0"))
            assert report.transports == {"distributed": ["engine:0"]}
            assert report.target_checksums["engine:0"] == state_checksums(state.items())
            for t in state.values():
                t.mul_(0.5).add_(1)
    finally:
        pusher.close()
        proc.stop()


def test_gloo_checkpoint_engine_backend_broadcasts_gpu_weights_through_the_host_bitwise() -> None:
    """--checkpoint-engine-backend gloo: GPU weights go over a gloo group (each bucket through the trainer's host
    memory) to an engine, here on the same GPU (which an NCCL group could not hold twice); every version lands
    bitwise and the group the pusher keeps open is gloo."""
    proc = _engine(0)
    pusher = WeightPusher(timeout_s=120)
    try:
        target = _target(proc)
        state = {k: v.bfloat16() for k, v in _weights("cuda:0").items()}
        for version in range(1, 4):
            report = pusher.push(_buckets(state), [target], version, requested="distributed",
                                 weights_device=torch.device("cuda:0"), group_backend="gloo")
            assert report.transports == {"distributed": ["engine:0"]}
            assert report.target_checksums["engine:0"] == state_checksums(state.items())
            for t in state.values():
                t.mul_(0.5).add_(1)
        ((_, transport),) = pusher._open.values()  # noqa: SLF001 - the open group's collective
        assert transport.group.backend == "gloo"
    finally:
        pusher.close()
        proc.stop()
