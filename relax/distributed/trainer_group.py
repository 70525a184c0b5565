"""The trainer group: the ranks of ``--resource``'s actor role (one per GPU) joined in one process group.

The driver hosts the group's rendezvous (a TCP store on its node, alive for the whole run), so every
rank joins in its constructor: no second set-up round and no guess of which node rank 0 lands on.
Collectives run over NCCL on GPU runs and gloo on CPU runs (``--distributed-backend gloo``: gloo on GPU runs
too), and give up after
``--distributed-timeout-minutes`` instead of hanging on a dead rank.

Rank 0 is the group's face: the driver calls only rank 0, and rank 0 hands what every rank must
run (a training step, offload / onload, a resume) to its peers as well (relax/distributed/actors.py);
with a sharded backend (Megatron) also the weight export, ``--save`` and ``--save-hf``.
With one rank no process group is made and nothing changes. What the ranks compute together is
data parallelism for the torch backend (relax/backends/torch/data_parallel.py), and for the Megatron
backend megatron-core's grid of tensor, pipeline, expert and data parallelism laid over this same
group (relax/backends/megatron/parallel.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from relax.utils.gloo import gloo_connects

# Every key of the trainer group's store lives under this prefix (the weight-sync groups have stores of their own).
STORE_PREFIX = "relax-trainer-group"


@dataclass(frozen=True)
class GroupMember:
    """What one trainer rank needs to join the group (picklable: it travels to the actor)."""

    rank: int
    world_size: int
    store_host: str
    store_port: int
    backend: str  # "nccl" (GPU runs) or "gloo" (CPU runs)
    timeout_minutes: float

    def join(self) -> None:
        import torch
        import torch.distributed as dist

        if self.backend == "nccl":
            torch.cuda.set_device(torch.cuda.current_device())
        timeout = timedelta(minutes=self.timeout_minutes)
        store = dist.TCPStore(self.store_host, self.store_port, is_master=False, timeout=timeout)
        with gloo_connects(lazily=True):  # as NCCL: at the first collective, through the driver's store
            dist.init_process_group(self.backend, store=dist.PrefixStore(STORE_PREFIX, store), rank=self.rank,
                                    world_size=self.world_size, timeout=timeout)


def group_backend(requested: str, device: str) -> str:
    """The group's process-group backend for ``--distributed-backend``: ``gloo`` is gloo everywhere; ``nccl`` (the
    seed's default) is NCCL on CUDA runs and gloo on CPU runs, where NCCL cannot run."""
    return "nccl" if requested == "nccl" and device == "cuda" else "gloo"


class TrainerGroup:
    """Driver side: the rendezvous store and the rank actors (``leader`` is rank 0)."""

    def __init__(self, actors: list, pids: list[int], store=None) -> None:
        self.actors = actors
        self.pids = pids
        self._store = store  # kept alive: NCCL exchanges its communicator ids through it on first use

    @property
    def leader(self):
        return self.actors[0]

    @classmethod
    def start(cls, actor_cls, config, device: str, rank_options: list[dict], *,
              timeout_minutes: float, backend: str = "nccl") -> TrainerGroup:
        """Start one trainer rank per entry of ``rank_options`` (rank r:
        ``actor_cls.options(**rank_options[r]).remote(config, device, member)``; its placement, relax/distributed/
        placement.py) and wait until all are up; a rank that fails to start fails the start at once, with its own
        error. ``config``: what every rank's constructor gets (the trainer's slice, relax/backends/config.py);
        ``timeout_minutes``: ``--distributed-timeout-minutes``, for the rendezvous and every collective;
        ``backend``: ``--distributed-backend`` (`group_backend`)."""
        import ray

        world_size = len(rank_options)
        if world_size == 1:
            actor = actor_cls.options(**rank_options[0]).remote(config, device, None)
            return cls([actor], [ray.get(actor.pid.remote())])
        import torch.distributed as dist

        host = ray.util.get_node_ip_address()
        timeout = timedelta(minutes=timeout_minutes)
        store = dist.TCPStore(host, 0, is_master=True, timeout=timeout, wait_for_workers=False)
        members = [GroupMember(rank, world_size, host, store.port, group_backend(backend, device), timeout_minutes)
                   for rank in range(world_size)]
        actors = [actor_cls.options(**options).remote(config, device, member)
                  for options, member in zip(rank_options, members, strict=True)]
        pids = _first_failure_first([actor.pid.remote() for actor in actors])
        ray.get(actors[0].attach_peers.remote(actors[1:]))
        return cls(actors, pids, store)


def _first_failure_first(refs: list) -> list:
    """``ray.get(refs)``, except that the first failure raises as soon as it happens: a rank that dies in its
    constructor must not leave the driver waiting for the others' rendezvous timeout."""
    import ray

    pending = list(refs)
    while pending:
        ready, pending = ray.wait(pending, num_returns=1)
        ray.get(ready)
    return ray.get(refs)
