"""CUDA IPC weight buckets between two real processes on one GPU (the colocate sync's fast path).

The receiver is a spawned process, as the engine actor is: it maps the sender's buffers (kept
mapped between buckets and syncs, as `EngineActor` does), copies them into its own tensors and
returns their checksums, which must equal the sender's after every sync, also when the sender
refills the same pooled buffer with new weights.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from relax.weights.broadcast import WeightReceiver
from relax.weights.checksum import state_checksums
from relax.weights.cuda_ipc import CudaIpcBucket, FlatBucket

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _receive(inbox, outbox) -> None:
    """Engine side: copy every bucket into its own GPU tensors (like update_weights_from_tensors)."""
    own: dict[str, torch.Tensor] = {}
    receiver = WeightReceiver("cuda")
    while (bucket := inbox.get()) is not None:
        if bucket == "checksums":
            outbox.put(state_checksums(own.items()))
            continue
        receiver.receive(bucket, lambda named: own.update((name, t.clone()) for name, t in named))
        outbox.put("copied")


def test_buckets_cross_processes_through_cuda_ipc_bitwise_across_syncs() -> None:
    g = torch.Generator().manual_seed(0)
    weights = {f"layer{i}.{kind}": torch.randn(257, 129, generator=g).to(dtype).cuda()
               for i in range(6) for kind, dtype in (("w", torch.bfloat16), ("norm", torch.float32))}
    weights["tied"] = weights["layer0.w"]
    names = list(weights)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(inbox, outbox))
    receiver.start()
    pool: dict = {}
    try:
        for sync in range(3):
            for chunk in (names[:5], names[5:]):
                inbox.put(CudaIpcBucket.share(FlatBucket.pack([(n, weights[n]) for n in chunk], pool=pool)))
                assert outbox.get(timeout=120) == "copied"
            inbox.put("checksums")
            assert outbox.get(timeout=120) == state_checksums(weights.items()), f"sync {sync}"
            for t in weights.values():  # an optimizer step: the next sync refills the same pool buffers
                t.add_(1)
        inbox.put(None)
    finally:
        receiver.join(timeout=60)
        if receiver.is_alive():
            receiver.kill()
    assert receiver.exitcode == 0
