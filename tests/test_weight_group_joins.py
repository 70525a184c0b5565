"""Joining a weight-update group (``/init_weights_update_group``), the two ways it broke on two GPUs.

* An engine whose device is a bare ``cuda`` (every engine on a GPU of its own: ``--device cuda`` under its
  own ``CUDA_VISIBLE_DEVICES``) refused every NCCL join with torch's "Expected a torch.device with a
  specified index". CPU torch runs the same device check without a GPU.
* A join refused by one engine left the sync waiting for the whole weights timeout (600 s in a run) in
  rank 0's rendezvous, which waited for every member; the seed's colocate layout looked hung.
"""

from __future__ import annotations

import time

import pytest
import torch

from relax.backends.embedded.launch import EngineProcess
from relax.models import build_model
from relax.utils.http_utils import EngineHTTPError
from relax.weights.devices import device_identity
from relax.weights.push import WeightPusher
from relax.weights.transports import SyncTarget
from relax.weights.transports import distributed as transport_module


def test_a_receiver_on_a_bare_cuda_device_joins_on_its_current_gpu(monkeypatch) -> None:
    chosen, built = [], []

    def set_device(device) -> None:  # torch's own check of the argument, then record the index
        chosen.append(torch.cuda._utils._get_device_index(device, optional=False))

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "set_device", set_device)
    monkeypatch.setattr(transport_module, "WeightUpdateGroup", lambda *a, **kw: built.append((a, kw)))
    receiver = transport_module.DistributedReceiver(torch.device("cuda"))
    message = receiver.init({"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2,
                             "group_name": "g", "backend": "nccl"})
    assert chosen == [1] and "joined g as rank 1 of 2 (nccl)" == message
    assert built[0][0] == ("127.0.0.1", 1, 1, 2) and built[0][1]["backend"] == "nccl"


@pytest.fixture
def engines():
    """Two CPU engine servers; the second takes requests only with its API key."""
    procs = [EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--device", "cpu"]),
             EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--device", "cpu", "--api-key", "right"])]
    yield procs
    for proc in procs:
        proc.stop()


def test_a_join_refused_by_one_engine_fails_the_sync_at_once_naming_it(engines) -> None:
    good, refusing = engines
    state = build_model("tiny-qwen3", seed=3).state_dict()
    cpu = device_identity("cpu")
    targets = [SyncTarget("engine:0", good.url, cpu), SyncTarget("engine:1", refusing.url, cpu, api_key="wrong")]
    pusher = WeightPusher(timeout_s=300)  # the bound a sync would otherwise wait out
    start = time.monotonic()
    try:
        with pytest.raises(EngineHTTPError) as refused:
            pusher.push([list(state.items())], targets, 1, requested="distributed",
                        weights_device=torch.device("cpu"))
    finally:
        pusher.close()
    assert time.monotonic() - start < 60
    assert refused.value.url.startswith(refusing.url) and "/init_weights_update_group" in refused.value.url
    # the engine that joined left the broken group again: a later sync to it alone works
    pusher = WeightPusher(timeout_s=60)
    try:
        report = pusher.push([list(state.items())], targets[:1], 2, requested="distributed",
                             weights_device=torch.device("cpu"))
    finally:
        pusher.close()
    assert report.transports == {"distributed": ["engine:0"]}
    assert report.target_checksums["engine:0"] == report.trainer_checksums
