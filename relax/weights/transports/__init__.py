"""Weight-sync transports: a registry of typed classes, each owning both ends of one SGLang endpoint.

``--weight-sync-transport``:

* ``tensor`` (`TensorTransport`): ``/update_weights_from_tensor`` with memory the trainer shares, a CUDA
  IPC handle to its packed GPU buffer (a target on the GPU that holds the trainer's weights: colocate)
  or a named shared-memory segment (host weights, a target on the same host; relax's engine copies it
  to its GPU: an offloaded colocate trainer);
* ``distributed`` (`DistributedTransport`): ``/init_weights_update_group`` +
  ``/update_weights_from_distributed``, a broadcast over NCCL (GPU weights) or gloo (host weights) to
  targets anywhere;
* ``auto``: ``tensor`` for each target whose (first) GPU holds the trainer's weights (a colocated engine of
  several GPUs too: its other ranks open the same handle and copy across), and for each one-rank relax engine on a
  GPU of the host that holds the trainer's weights (an offloaded colocate trainer: a copy from shared memory,
  not a gloo broadcast through the loopback); ``distributed`` for every other
  target (CPU runs included: gloo between two host processes).

`choose` decides per target; a forced transport that cannot reach a target is an error naming both devices.
"""

from __future__ import annotations

from relax.weights.devices import host_of
from relax.weights.transports.base import PackedBucket, SyncTarget, Transport
from relax.weights.transports.distributed import DistributedTransport
from relax.weights.transports.tensor import TensorTransport

TRANSPORTS: dict[str, type[Transport]] = {cls.name: cls for cls in (TensorTransport, DistributedTransport)}
CHOICES = ("auto", *TRANSPORTS)

__all__ = ["CHOICES", "TRANSPORTS", "PackedBucket", "SyncTarget", "Transport", "choose"]


def _shares_memory(weights_at: str, target: SyncTarget) -> bool:
    """A target can map the trainer's buffer: the same GPU, the host of the same machine, or (host weights) a
    GPU of that machine whose engine copies from a shared host buffer."""
    if target.device == weights_at and weights_at != "unknown":
        return True
    return (weights_at.startswith("cpu:") and target.host_tensors and target.device.startswith("cuda:")
            and host_of(target.device) == host_of(weights_at))


def choose(requested: str, weights_at: str, targets: list[SyncTarget]) -> dict[str, list[SyncTarget]]:
    """Transport name -> its targets, in the targets' order (``weights_at``: `relax.weights.device_identity`)."""
    if requested not in CHOICES:
        raise ValueError(f"unknown weight-sync transport {requested!r}; one of {', '.join(CHOICES)}")
    plan: dict[str, list[SyncTarget]] = {}
    for target in targets:
        if requested == "tensor" and not _shares_memory(weights_at, target):
            raise ValueError(f"--weight-sync-transport tensor: {target.side} is on {target.device} but the trainer's "
                             f"weights are on {weights_at}; sharing memory needs both on one GPU, or host weights and "
                             "a relax engine on the same machine: use auto or distributed")
        if requested == "tensor" and target.tp_size != 1 and target.device != weights_at:
            raise ValueError(f"--weight-sync-transport tensor: {target.side} has {target.tp_size} tensor-parallel "
                             "ranks and its first GPU does not hold the trainer's weights; the shared-memory path "
                             "reaches such an engine from that GPU only (use auto or distributed)")
        # auto keeps host-to-host (CPU runs) on the broadcast: only a GPU target gains from the shared segment
        mapped = target.device.startswith("cuda:") and _shares_memory(weights_at, target)
        shared = mapped and (target.tp_size == 1 or target.device == weights_at)
        kind = requested if requested != "auto" else ("tensor" if shared else "distributed")
        plan.setdefault(kind, []).append(target)
    return plan
