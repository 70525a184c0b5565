"""The weight-update process group of SGLang's ``/init_weights_update_group``, built the way SGLang builds it.

The trainer is rank 0 and engines join at ``rank_offset`` (+ their TP rank). SGLang
(``sglang/srt/utils/common.py`` ``init_custom_process_group``) rendezvouses over
``tcp://master_address:master_port`` (rank 0 hosts the TCP store), prefixes the store with the group
name and creates the group with torch's ``_new_process_group_helper``, outside the default process
group. Our receiver (the embedded engine) builds the group with the same calls, so either can be the
engine: the store keys must agree byte for byte. Rank 0 hosts the same store but does not wait in it
for the members (torch's rendezvous would, up to the whole timeout): the sender knows from each
member's answer to ``/init_weights_update_group`` whether it joined, and fails at the first refusal
(relax/weights/transports/distributed.py).

NCCL when the tensors live on GPUs, gloo when on the host (CPU runs and CI). Every collective gives
up after ``timeout_s`` instead of hanging on a peer that died.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from datetime import timedelta

import torch

from relax.observability.collective_memory import checked
from relax.utils.gloo import gloo_connects

BACKENDS = ("nccl", "gloo")
_FIRST_POLL_S, _LONGEST_POLL_S = 0.0005, 0.05  # gloo waits: first and longest sleep between polls


def host_store(master_address: str, world_size: int, timeout_s: float, port: int = 0):
    """Rank 0's store, what torch's tcp:// rendezvous makes, without waiting for the members. ``port`` 0: one the
    OS picks as it binds, to tell the members afterwards (``store.port``); a port found free and bound later
    can be taken in between, by any process's outgoing connection (EADDRINUSE)."""
    import torch.distributed as dist

    return dist.TCPStore(master_address, port, world_size, is_master=True, timeout=timedelta(seconds=timeout_s),
                         multi_tenant=True, wait_for_workers=False)


class WeightUpdateGroup:
    """One member's handle on a weight-update group (rank 0: the sender)."""

    def __init__(self, master_address: str, master_port: int, rank: int, world_size: int, *,
                 group_name: str = "weight_update_group", backend: str = "nccl", timeout_s: float = 300.0,
                 store=None):
        """``store``: rank 0's store, made by `host_store` before the members were told its port."""
        import torch.distributed as dist
        from torch.distributed import distributed_c10d as c10d

        if backend not in BACKENDS:
            raise ValueError(f"weight update group backend {backend!r}: one of {', '.join(BACKENDS)}")
        if backend == "nccl" and not torch.cuda.is_available():
            raise ValueError("weight update group backend 'nccl' needs a CUDA device; this process has none "
                             "(use backend 'gloo')")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is outside the group's world of {world_size}")
        if not group_name:
            raise ValueError("group_name must not be empty")
        timeout = timedelta(seconds=timeout_s)
        if rank == 0:
            store = store or host_store(master_address, world_size, timeout_s, port=int(master_port))
        else:
            store, _, _ = next(c10d.rendezvous(f"tcp://{_host(master_address)}:{int(master_port)}", rank,
                                               world_size, timeout=timeout))
        store.set_timeout(timeout)
        with gloo_connects(lazily=False):  # a dead member then fails the next broadcast (relax/utils/gloo.py)
            self.pg, _ = c10d._new_process_group_helper(  # noqa: SLF001 - what SGLang (and vLLM) call
                world_size, rank, [], c10d.Backend(backend), dist.PrefixStore(group_name, store),
                group_name=group_name, backend_options=None, timeout=timeout)
        c10d._world.pg_group_ranks[self.pg] = {i: i for i in range(world_size)}  # noqa: SLF001
        self._store = store  # rank 0's store serves the others: keep it alive with the group
        self.rank, self.world_size, self.group_name, self.backend = rank, world_size, group_name, backend
        self.broken = False  # a broadcast failed: the group is unusable and its close collects garbage

    @property
    def device(self) -> torch.device:
        """Where the group's tensors must live."""
        return torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")

    def broadcast(self, tensors: Iterable[torch.Tensor], src: int = 0) -> None:
        """Broadcast each tensor from ``src`` (sender and receivers call this alike, in the same order).

        A failure is raised as a new ``RuntimeError`` carrying the message only: torch's exception keeps
        its frames, and they hold the process group, whose sockets close only when the last reference
        goes (neither ``shutdown()`` nor ``abort()`` closes them). A peer still waiting in this broadcast
        (the survivors of a dead engine) is released when `close` frees the group and, with gloo, by the
        "broken" mark this end leaves in the group's store (`_wait`), which also reaches a member whose
        receive was posted too late for the closing sockets to end it."""
        import torch.distributed as dist

        failure, notes = None, []
        try:
            with checked(f"broadcast({self.group_name})", rank=self.rank):
                works = [dist.broadcast(t, src=src, group=self.pg, async_op=True) for t in tensors]
                for work in works:
                    self._wait(work)
        except RuntimeError as exc:
            failure, notes = str(exc), list(getattr(exc, "__notes__", ()))  # --enable-cuda-memory-check's note
        finally:
            works = work = None  # noqa: F841 - the pending works hold the group too
        if failure is not None:
            self.broken = True
            self._tell_members_it_broke()
            error = RuntimeError(failure)
            for note in notes:
                error.add_note(note)
            raise error

    def _wait(self, work) -> None:
        """Wait for one broadcast. A gloo wait blocks the host, and a member whose receive was posted after
        the sender gave up (or that the sender's closing did not reach) would wait out the whole group
        timeout: so a member's gloo waits poll the work and, between polls, the group's store for the
        sender's "broken" mark (or for the store itself being gone, with the sender). The sender waits
        plainly: a dead member fails its send."""
        if self.backend != "gloo" or self.rank == 0:  # the sender's own failures come from gloo itself
            work.wait()
            return
        delay = _FIRST_POLL_S
        while not work.is_completed():
            time.sleep(delay)
            delay = min(2 * delay, _LONGEST_POLL_S)
            if not work.is_completed() and self._sender_gave_up():
                raise RuntimeError(f"weight update group {self.group_name!r}: the sender gave up on this "
                                   f"broadcast (a member failed) and left the group")
        work.wait()  # raises the broadcast's own error, if it failed

    def _broken_key(self) -> str:
        return f"{self.group_name}/broken"

    def _tell_members_it_broke(self) -> None:
        try:
            self._store.set(self._broken_key(), "1")
        except Exception:  # noqa: BLE001 - a store that is gone tells the members the same
            pass

    def _sender_gave_up(self) -> bool:
        try:
            return bool(self._store.check([self._broken_key()]))
        except Exception:  # noqa: BLE001 - the store lives in the sender's process: gone means the sender left
            return True

    def close(self) -> None:
        """Leave the group and free it, so its connections close and the peers' pending receives fail."""
        import gc

        import torch.distributed as dist

        if self.pg is not None:
            if self.backend == "nccl" and self.broken:  # a member is gone: a collective teardown would wait for it
                from torch.distributed import distributed_c10d as c10d

                c10d._abort_process_group(self.pg)  # noqa: SLF001
            else:  # NCCL: every member tears down together (DistributedTransport.close asks them all at once)
                dist.destroy_process_group(self.pg)
            self.pg, self._store = None, None
            if self.broken:
                gc.collect()  # a failure's traceback cycles may still reach the group's C++ object


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address and not address.startswith("[") else address
