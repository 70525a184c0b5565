"""CUDA IPC weight buckets between two real processes on one GPU (the colocate sync's fast path).

The receiver is a spawned process, as the engine actor is: it maps the sender's buffers, copies
them into its own tensors and returns their checksums, which must equal the sender's.
"""

from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from relax.weights.checksum import state_checksums
from relax.weights.cuda_ipc import CudaIpcBucket, FlatBucket, bucket_tensors

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _receive(inbox, outbox) -> None:
    """Engine side: copy every bucket into its own GPU tensors (like update_weights_from_tensors)."""
    own: dict[str, torch.Tensor] = {}
    while (bucket := inbox.get()) is not None:
        for name, t in bucket_tensors(bucket):
            own[name] = t.clone()
        torch.cuda.synchronize()
        outbox.put("copied")
    outbox.put(state_checksums(own.items()))


def test_buckets_cross_processes_through_cuda_ipc_bitwise() -> None:
    g = torch.Generator().manual_seed(0)
    weights = {f"layer{i}.{kind}": torch.randn(257, 129, generator=g).to(dtype).cuda()
               for i in range(6) for kind, dtype in (("w", torch.bfloat16), ("norm", torch.float32))}
    weights["tied"] = weights["layer0.w"]
    names = list(weights)
    ctx = mp.get_context("spawn")
    inbox, outbox = ctx.Queue(), ctx.Queue()
    receiver = ctx.Process(target=_receive, args=(inbox, outbox))
    receiver.start()
    try:
        for chunk in (names[:5], names[5:]):
            flat = FlatBucket.pack([(n, weights[n]) for n in chunk])  # kept alive until the receiver copied
            inbox.put(CudaIpcBucket.share(flat))
            assert outbox.get(timeout=120) == "copied"
            del flat
        inbox.put(None)
        received = outbox.get(timeout=120)
    finally:
        receiver.join(timeout=60)
        if receiver.is_alive():
            receiver.kill()
    assert receiver.exitcode == 0
    assert received == state_checksums(weights.items())
