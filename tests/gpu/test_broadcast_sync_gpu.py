"""NCCL weight broadcast between two processes on two GPUs (the sync to engines on other GPUs).

The receiver (an engine stand-in on GPU 1) joins the trainer's weight group, receives packed
buckets over NCCL and copies them into its own tensors; its checksums must equal the sender's
after every sync, including after the sender refilled its pooled buffers with new weights.
"""

from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from relax.weights.broadcast import BroadcastBucket, WeightReceiver, WeightSender
from relax.weights.checksum import state_checksums
from relax.weights.cuda_ipc import FlatBucket

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


def _receive(port: int, inbox, outbox) -> None:
    receiver = WeightReceiver("cuda:1")
    receiver.join("127.0.0.1", port, 1, 2, "nccl", "test-weights", 120.0)
    own: dict[str, torch.Tensor] = {}
    while (bucket := inbox.get()) is not None:
        if bucket == "checksums":
            outbox.put(state_checksums(own.items()))
            continue
        receiver.receive(bucket, lambda named: own.update((name, t.clone()) for name, t in named))
        outbox.put("copied")


def test_buckets_reach_another_gpu_by_nccl_bitwise_across_syncs() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    g = torch.Generator().manual_seed(0)
    weights = {f"layer{i}.{kind}": torch.randn(300, 77, generator=g).to(dtype).cuda(0)
               for i in range(5) for kind, dtype in (("w", torch.bfloat16), ("norm", torch.float32))}
    names = list(weights)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    proc = ctx.Process(target=_receive, args=(port, inbox, outbox))
    proc.start()
    try:
        sender = WeightSender()
        torch.cuda.set_device(0)
        sender.join("127.0.0.1", port, 0, 2, "nccl", "test-weights", 120.0)
        pool: dict = {}
        for sync in range(3):
            for chunk in (names[:4], names[4:]):
                flat = FlatBucket.pack([(n, weights[n]) for n in chunk], pool=pool)
                inbox.put(BroadcastBucket.of(flat))
                sender.send(flat)
                assert outbox.get(timeout=120) == "copied"
            inbox.put("checksums")
            assert outbox.get(timeout=120) == state_checksums(weights.items()), f"sync {sync}"
            for t in weights.values():
                t.mul_(0.5).add_(1)
        inbox.put(None)
        sender.close()
    finally:
        proc.join(timeout=60)
        if proc.is_alive():
            proc.kill()
    assert proc.exitcode == 0
