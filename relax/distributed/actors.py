"""The Ray actors of a run: the trainer, the rollout engines and the fully-async services.

All are thin: all logic lives in the backend, engine and service classes, so the same code runs
in a unit test without Ray. Each actor pins torch to one thread (see placement.worker_env).
"""

from __future__ import annotations

import os
import threading
from argparse import Namespace

import ray
import torch

from relax.distributed.trainer_group import GroupMember
from relax.weights import checksum
from relax.weights.broadcast import BroadcastBucket, WeightReceiver, WeightSender
from relax.weights.cuda_ipc import CudaIpcBucket, FlatBucket, device_identity


def _init_process() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))


@ray.remote
class TrainerActor:
    """One rank of the trainer group (relax/distributed/trainer_group.py); ``member`` is None for a lone trainer.

    The driver talks to rank 0 only. Rank 0 passes what every rank must run (a training step,
    offload / onload, a resume) to its peers and waits for them; the weights are replicated
    (data parallelism), so weight syncs, checksums and checkpoints are rank 0's alone.
    """

    def __init__(self, args: Namespace, device: str, member: GroupMember | None = None):
        _init_process()
        from relax.backends.train_registry import build_train_backend

        if member is not None:
            member.join()
        self._peers: list = []  # rank 0: the other ranks' actor handles
        self.backend = build_train_backend(args, device)
        checksum.warm_up(self.backend.device)
        self._buckets: list = []
        self._pool: dict = {}  # dtype -> the persistent buffer buckets are packed into (cuda-ipc, broadcast)
        self._packed: tuple[int, object] | None = None  # (bucket index, FlatBucket) in the pool
        self._pack_lock = threading.Lock()  # get_bucket and broadcast_bucket may run on two threads
        self._sender = WeightSender()

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

    def _with_peers(self, method: str, args: tuple, local):
        """``local()`` here while the peers run ``method(*args)``; rank 0's result.

        A peer's failure raises at once, even while this rank waits for that peer inside a collective
        (the driver then ends the run and the stuck collective with it), and so does this rank's own.
        """
        peers = [getattr(peer, method).remote(*args) for peer in self._peers]
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

    def offload(self) -> dict[str, float]:
        return self._with_peers("offload", (), self.backend.offload)

    def onload(self) -> dict[str, float]:
        return self._with_peers("onload", (), self.backend.onload)

    def prepare_sync(self, bucket_bytes: int) -> tuple[int, str, int]:
        """Split the weights into buckets: (how many, `device_identity` of where they are now (an offloaded
        trainer's weights are on the host even on a GPU run), bytes in all)."""
        def export() -> list:
            return list(self.backend.weight_buckets(bucket_bytes))

        # a sharded (Megatron) trainer gathers its buckets on rank 0 with every rank taking part
        buckets = self._with_peers("export_weights", (bucket_bytes,), export) if self._collective else export()
        self._buckets, self._packed = buckets, None
        tensors = [t for bucket in self._buckets for _, t in bucket]
        where = device_identity(tensors[0].device) if tensors else "cpu"
        return len(self._buckets), where, sum(t.numel() * t.element_size() for t in tensors)

    def get_bucket(self, index: int, transport: str = "object-store"):
        """Bucket ``index`` for ``transport`` (relax/weights/sync.py): host tensors; CUDA IPC handles to the bucket
        packed in the persistent pool; or, for ``broadcast``, its layout (`broadcast_bucket` sends the bytes).
        The pool is refilled only when the next bucket is asked for (every target has copied this one by then)."""
        if transport == "object-store":
            return [(name, t.cpu()) for name, t in self._buckets[index]]
        flat = self._pack(index)
        return CudaIpcBucket.share(flat) if transport == "cuda-ipc" else BroadcastBucket.of(flat)

    def broadcast_bucket(self, index: int) -> None:
        self._sender.send(self._pack(index))

    def _pack(self, index: int):
        with self._pack_lock:
            if self._packed is None or self._packed[0] != index:
                self._packed = (index, FlatBucket.pack(self._buckets[index], pool=self._pool))
            return self._packed[1]

    def weight_group_address(self) -> tuple[str, int]:
        return self._sender.address()

    def join_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str, name: str,
                          timeout_s: float) -> None:
        self._sender.join(address, port, rank, world_size, backend, name, timeout_s)

    def finish_sync(self) -> dict[str, str]:
        """Checksums of exactly the tensors this sync sent: the names and bytes `backend.checksums()` would
        digest, without exporting the weights a second time (the Megatron export splits qkv / fc1)."""
        sent = [named for bucket in self._buckets for named in bucket]
        self._buckets, self._packed = [], None
        return checksum.state_checksums(sent) if sent else self.backend.checksums()

    def save(self, directory: str, save_optimizer: bool) -> None:
        def local() -> None:
            self.backend.save(directory, save_optimizer=save_optimizer)

        return self._with_peers("save", (directory, save_optimizer), local) if self._collective else local()

    def load(self, directory: str) -> None:
        self._with_peers("load", (directory,), lambda: self.backend.load(directory))

    def save_hf(self, directory: str) -> None:
        def local() -> None:
            self.backend.save_hf(directory)

        return self._with_peers("save_hf", (directory,), local) if self._collective else local()


@ray.remote
class EngineActor:
    """Hosts one embedded engine over the HF model named by ``--hf-checkpoint``."""

    def __init__(self, args: Namespace, device: str, engine_id: int):
        _init_process()

        self.engine_id = engine_id
        self.engine = build_engine(args, device)
        checksum.warm_up(self.engine.device)

        self.scheduler = None
        self.url: str | None = None
        self._receiver = WeightReceiver(self.engine.device)
        if args.custom_generate_function_path or args.partial_rollout:  # both talk HTTP to the engine
            self._serve_http()

    def _serve_http(self) -> None:
        """Serve SGLang's HTTP API over this same engine (custom generate functions, partial rollout), on loopback.

        HTTP requests go through the continuous-batching scheduler; the actor's own batch calls and
        weight updates run between its decode steps (``scheduler.exclusive()``).
        """
        import asyncio
        import socket

        from aiohttp import web

        from relax.backends.embedded.scheduler import Scheduler
        from relax.backends.embedded.server import EngineServer

        self.scheduler = Scheduler(self.engine)
        sock = socket.socket()
        sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        ready = threading.Event()
        loop = asyncio.new_event_loop()

        async def start() -> None:
            runner = web.AppRunner(EngineServer(self.scheduler).app(), access_log=None)
            await runner.setup()
            await web.SockSite(runner, sock).start()
            ready.set()

        def run() -> None:
            asyncio.set_event_loop(loop)
            loop.run_until_complete(start())
            loop.run_forever()

        threading.Thread(target=run, name="relax-engine-http", daemon=True).start()
        if not ready.wait(60):
            raise RuntimeError(f"engine HTTP server did not start on {self.url}")

    def _exclusive(self, fn):
        if self.scheduler is None:
            return fn(self.engine)
        with self.scheduler.exclusive() as engine:
            return fn(engine)

    def pid(self) -> int:
        return os.getpid()

    def http_url(self) -> str | None:
        return self.url

    def generate(self, requests: list[dict]) -> list[dict]:
        return self._exclusive(lambda engine: engine.generate(requests))

    def device_identity(self) -> str:
        return device_identity(self.engine.device)

    def update_weights(self, bucket, version: int | None) -> int:
        """One sync bucket (host tensors, `CudaIpcBucket` handles or a `BroadcastBucket`, relax/weights/sync.py)."""

        def apply(engine) -> int:
            self._receiver.receive(bucket, lambda named: engine.update_weights_from_tensors(named, version=version))
            return engine.weight_version

        return self._exclusive(apply)

    def join_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str, name: str,
                          timeout_s: float) -> None:
        self._receiver.join(address, port, rank, world_size, backend, name, timeout_s)

    def checksums(self) -> dict[str, str]:
        return self._exclusive(lambda engine: engine.weight_checksums())

    def release_memory_occupation(self) -> dict[str, float]:
        """SGLang's /release_memory_occupation on an idle engine: seconds taken and device bytes freed."""
        return self._exclusive(lambda engine: _timed_memory(engine, engine.release_memory_occupation, freed=True))

    def resume_memory_occupation(self) -> dict[str, float]:
        return self._exclusive(lambda engine: _timed_memory(engine, engine.resume_memory_occupation, freed=False))

    def weights_checker(self, action: str, **kwargs) -> dict:
        """SGLang's /weights_checker actions (snapshot, reset_tensors, checksum, compare) on this engine."""
        from relax.backends.embedded.weights_checker import WeightsChecker

        return self._exclusive(lambda engine: WeightsChecker(engine.model).run(action, **kwargs))


def build_engine(args: Namespace, device: str):
    """The embedded engine an `EngineActor` hosts: ``--hf-checkpoint`` in the trainer's export dtype, with
    the runner ``--embedded-runner`` / ``--embedded-cuda-graph`` / ``--embedded-compile`` resolve to on
    ``device`` (relax/backends/embedded/runner_choice.py)."""
    from relax.backends.embedded.engine import EmbeddedEngine
    from relax.backends.embedded.runner_choice import engine_runner_kwargs
    from relax.backends.train_registry import weight_dtype
    from relax.models import build_model, load_tokenizer

    tokenizer = load_tokenizer(args.hf_checkpoint)
    # the engine holds weights in the trainer's export dtype, so both sides' checksums agree bitwise
    dtype = weight_dtype(args.train_backend)
    model = build_model(args.hf_checkpoint, dtype=dtype, seed=args.seed).to(device).eval()
    eos = [t for t in [tokenizer.eos_token_id, getattr(model.config, "eos_token_id", None)] if isinstance(t, int)]
    return EmbeddedEngine(model, eos_token_ids=sorted(set(eos)), device=device,
                          max_context_len=args.rollout_max_context_len, tokenizer=tokenizer,
                          **engine_runner_kwargs(args, device, model))


def _timed_memory(engine, fn, *, freed: bool) -> dict[str, float]:
    """Run a release/resume; ``device_bytes``: CUDA memory freed (release) or taken back (resume), 0 on CPU."""
    import time

    import torch

    cuda = engine.device.type == "cuda"
    start, before = time.perf_counter(), torch.cuda.memory_allocated(engine.device) if cuda else 0
    fn()
    after = torch.cuda.memory_allocated(engine.device) if cuda else 0
    return {"seconds": time.perf_counter() - start, "device_bytes": max(before - after if freed else after - before, 0)}


@ray.remote
class ForwardServiceActor:
    """The ``reference`` or ``actor_fwd`` service (`relax.core.services.ForwardService`)."""

    def __init__(self, args: Namespace, device: str, role: str):
        _init_process()
        from relax.core.services import ForwardService

        self.service = ForwardService(args, device, role)
        checksum.warm_up(self.service.backend.device)
        self._receiver = WeightReceiver(self.service.backend.device)

    def pid(self) -> int:
        return os.getpid()

    def log_probs(self, samples):
        return self.service.log_probs(samples)

    def device_identity(self) -> str:
        return device_identity(self.service.backend.device)

    def update_weights(self, bucket, version: int | None) -> int | None:
        return self._receiver.receive(bucket, lambda named: self.service.update_weights(named, version))

    def join_weight_group(self, address: str, port: int, rank: int, world_size: int, backend: str, name: str,
                          timeout_s: float) -> None:
        self._receiver.join(address, port, rank, world_size, backend, name, timeout_s)

    def checksums(self) -> dict[str, str]:
        return self.service.checksums()

    def weights_checker(self, action: str, **kwargs) -> dict:
        return self.service.weights_checker(action, **kwargs)


@ray.remote
class AdvantagesActor:
    """The ``advantages`` service (`relax.core.services.AdvantageService`), CPU only."""

    def __init__(self, args: Namespace):
        _init_process()
        from relax.core.services import AdvantageService

        self.service = AdvantageService(args)

    def pid(self) -> int:
        return os.getpid()

    def compute(self, samples, old_log_probs, ref_log_probs):
        return self.service.compute(samples, old_log_probs, ref_log_probs)
