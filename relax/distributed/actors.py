"""The trainer's Ray actor: one rank of the trainer group; rank 0 is the face the driver calls.

Thin: the RL step lives in the backend, the weight push in `relax.weights.push`. The engines' actor
is relax/distributed/engine_actor.py, the services' relax/distributed/service_actors.py. Each actor
pins torch to one thread (see cluster.worker_env).
"""

from __future__ import annotations

import itertools
import os
import threading
import time

import ray
import torch

from relax.backends.config import TrainerConfig
from relax.checkpoint_io import BackgroundWrite
from relax.distributed.trainer_group import GroupMember
from relax.observability import collective_memory
from relax.utils.fault_hooks import checkpoint_write_delay
from relax.utils.gc_pauses import collections_paused, freeze_startup_objects
from relax.weights import checksum
from relax.weights.push import PushOptions, PushReport, WeightPusher


def _init_process() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@ray.remote
class TrainerActor:
    """One rank of the trainer group (relax/distributed/trainer_group.py); ``member`` is None for a lone trainer.

    The driver talks to rank 0 only. Rank 0 passes what every rank must run (a training step,
    offload / onload, a resume) to its peers and waits for them; the weights are replicated
    (data parallelism), so weight syncs, checksums and checkpoints are rank 0's alone.
    """

    def __init__(self, cfg: TrainerConfig, device: str, member: GroupMember | None = None):
        _init_process()
        with collections_paused():  # the model classes' imports and the build (relax/utils/gc_pauses.py)
            from relax.backends.train_registry import build_train_backend

            if member is not None:
                member.join()
            # --enable-cuda-memory-check: this rank's collectives (relax/observability/collective_memory.py)
            collective_memory.configure(cfg.collectives, rank=member.rank if member is not None else 0)
            self._peers: list = []  # rank 0: the other ranks' actor handles
            self.backend = build_train_backend(cfg, device)
            checksum.warm_up(self.backend.device)
        self._pusher = WeightPusher()
        self._background: BackgroundWrite | None = None  # the --async-save write in flight, or the last one
        freeze_startup_objects()  # the model and the imports: full GCs skip them (relax/utils/gc_pauses.py)

    def attach_peers(self, peers: list) -> None:
        self._peers = list(peers)

    @property
    def _collective(self) -> bool:
        """Whether the backend's weights are sharded over the ranks (Megatron), so that every rank takes part in
        exporting, checkpointing and ``--save-hf``; replicated weights (torch) are rank 0's alone."""
        return bool(getattr(self.backend, "collective_io", False))

    def export_weights(self, bucket_bytes: int) -> int:
        """A peer's part of rank 0's weight export: iterate the backend's buckets (its gathers), discard them."""
        return sum(1 for _ in self.backend.weight_buckets(bucket_bytes))

    def _with_peers(self, method: str, call_args: tuple, local):
        """``local()`` here while the peers run ``method(*call_args)``; rank 0's result.

        A peer's failure raises at once, even while this rank waits for that peer inside a collective
        (the driver then ends the run and the stuck collective with it), and so does this rank's own.
        """
        peers = [getattr(peer, method).remote(*call_args) for peer in self._peers]
        if not peers:
            return local()
        outcome: dict = {}

        def run() -> None:
            try:
                outcome["value"] = local()
            except BaseException as exc:  # noqa: BLE001 - re-raised below, in the actor's own thread
                outcome["error"] = exc

        worker = threading.Thread(target=run, name=f"relax-trainer-{method}", daemon=True)
        worker.start()
        while peers and "error" not in outcome:
            ready, peers = ray.wait(peers, num_returns=1, timeout=0.1)
            ray.get(ready)  # a failed or dead peer raises here
        if "error" not in outcome:
            worker.join()
        if "error" in outcome:
            raise outcome["error"]
        return outcome["value"]

    def pid(self) -> int:
        return os.getpid()

    def describe(self) -> dict:
        return {**self.backend.describe(), "data_parallel_size": self.backend.dp.size}

    def train_rollout(self, samples, step: int, precomputed=None) -> dict:
        """``samples``: the train samples, or an object whose ``fetch()`` returns them (the fully-async
        loop's `StoredBatch`: the data comes from the storage units straight to every rank)."""
        shared = samples if hasattr(samples, "fetch") or not self._peers else ray.put(samples)

        def local() -> dict:
            data = samples.fetch() if hasattr(samples, "fetch") else samples
            # precomputed: columns from the fully-async services (relax/core/services.py)
            metrics = (self.backend.train_rollout(data, step) if precomputed is None
                       else self.backend.train_rollout(data, step, precomputed))
            if self.backend.device.type == "cuda":  # the last optimizer step's kernels count as training, not
                torch.cuda.synchronize(self.backend.device)  # as the wait of the sync that reads the weights
            return metrics

        return self._with_peers("train_rollout", (shared, step, precomputed), local)

    def freeze_gc(self) -> int:
        """`freeze_startup_objects` on every rank once the first steps have compiled (relax/utils/gc_pauses.py)."""
        return self._with_peers("freeze_gc", (), freeze_startup_objects)

    def offload(self) -> dict[str, float]:
        return self._with_peers("offload", (), self.backend.offload)

    def onload(self) -> dict[str, float]:
        return self._with_peers("onload", (), self.backend.onload)

    def push_weights(self, targets: list, version: int, options: PushOptions) -> PushReport:
        """Push the weights to ``targets`` (`relax.weights.transports.SyncTarget`) as ``version`` over SGLang's
        HTTP API (`relax.weights.push`); the weights leave from where they are now (an offloaded trainer's
        are on the host even on a GPU run). A sharded (Megatron) trainer streams its buckets from rank 0
        while every peer runs the same export (its part of the gathers)."""

        def local() -> PushReport:
            self._pusher.timeout_s = options.timeout_s
            buckets = iter(self.backend.weight_buckets(options.bucket_bytes))
            first = next(buckets, [])
            where = first[0][1].device if first else self.backend.device
            return self._pusher.push(itertools.chain([first], buckets), targets, version,
                                     requested=options.transport, weights_device=where,
                                     keep_snapshot=options.keep_snapshot, group_backend=options.group_backend)

        if self._collective:
            return self._with_peers("export_weights", (options.bucket_bytes,), local)
        return local()

    def resync(self, targets: list) -> PushReport:
        """Bring restarted ``targets`` to the last push's version with its kept bytes (fault tolerance)."""
        return self._pusher.resync(targets)

    def save(self, directory: str, save_optimizer: bool, critic_directory: str | None = None,
             background: bool = False) -> None:
        """Write a checkpoint to ``directory``. ``background`` (``--async-save``): the torch backend's host copy of
        the state, written in a thread of rank 0 while training goes on; a ``collective_io`` backend's (Megatron)
        shards, handed on every rank to megatron-core's async writer. `save_status` reports on either."""
        if background and self._collective:
            self.wait_save()  # every rank's earlier save finalized (a no-op on the peers, called after it)
            return self._with_peers("save", (directory, save_optimizer, critic_directory, True),
                                    lambda: self.backend.save(directory, save_optimizer=save_optimizer,
                                                              critic_directory=critic_directory, background=True))
        if background:
            self.wait_save()  # the driver waits too: one write in flight at a time
            files = self.backend.checkpoint_files(directory, save_optimizer=save_optimizer,
                                                  critic_directory=critic_directory)
            self._background = BackgroundWrite(files, after=lambda: time.sleep(checkpoint_write_delay()))
            return None

        def local() -> None:
            self.backend.save(directory, save_optimizer=save_optimizer, critic_directory=critic_directory)
            time.sleep(checkpoint_write_delay())  # 0 unless the harness plants a slow disk

        return (self._with_peers("save", (directory, save_optimizer, critic_directory), local) if self._collective
                else local())

    def save_status(self) -> str:
        """The background save's state: ``running``, ``done`` (also when none was started) or its failure's line.
        Local to this rank (the driver polls it while a step trains: the actor's second concurrency slot)."""
        if self._collective:
            return self.backend.save_status()
        return self._background.status() if self._background is not None else "done"

    def wait_save(self) -> str:
        """Wait for the background save to be written (and, Megatron, finalized: a collective of every rank)."""
        if self._collective:
            return self._with_peers("wait_save", (), self.backend.finish_saves)
        return self._background.join() if self._background is not None else "done"

    def load(self, directory: str, critic_directory: str | None = None) -> None:
        self._with_peers("load", (directory, critic_directory),
                         lambda: self.backend.load(directory, critic_directory=critic_directory))

    def save_hf(self, directory: str) -> None:
        def local() -> None:
            self.backend.save_hf(directory)

        return self._with_peers("save_hf", (directory,), local) if self._collective else local()
