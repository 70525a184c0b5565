"""The trainer's side of a weight sync: rank 0 pushes its weights to every target over SGLang's HTTP API.

Per sync (slime's shape): the backend's buckets (full HF-named tensors, ``--update-weight-buffer-size``
bytes at most; a sharded backend gathers each bucket first) are packed one at a time into one
persistent uint8 buffer on the weights' device, and every transport of the plan
(`relax.weights.transports.choose`) delivers it to its targets; the buffer is refilled only once every
target has answered. The version flips and caches flush with the last bucket. Then the checksums of
both sides: the trainer's of exactly the bytes it sent, each target's from ``/weights_checker``
(``checksum``). The embedded engine answers relax's checksums of HF-named tensors; a stock SGLang server
its own hashes of its fused parameters, which the trainer then computes too, over the same bytes laid out
as SGLang holds them (`relax.weights.sglang_checksums`). A target whose answer cannot be matched is
recorded as unverified, with the reason.

With ``keep_snapshot`` (fault tolerance) a host copy of every packed bucket is kept, so an engine
restarted later gets exactly this version's bytes (`WeightPusher.resync`), never the trainer's live
weights, which may be half-way through the next optimizer step.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from relax.weights.checksum import state_checksums
from relax.weights.devices import device_identity
from relax.weights.serialized_tensors import TensorEntry, flatten_into, layout, unflatten
from relax.weights.sglang_checksums import SGLangLayoutChecksums, layout_name, unverifiable
from relax.weights.transports import TRANSPORTS, PackedBucket, SyncTarget, Transport, choose

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True)
class PushOptions:
    """The sync settings the trainer needs (a typed slice of the flags, built by the driver)."""

    transport: str = "auto"  # --weight-sync-transport
    bucket_bytes: int = 512 << 20  # --update-weight-buffer-size
    keep_snapshot: bool = False  # --use-fault-tolerance: keep the bytes for restarted engines
    group_backend: str = "nccl"  # --checkpoint-engine-backend: the broadcast's collective for GPU weights
    timeout_s: float = 300.0  # every wait on a target (a hung engine fails the push instead of blocking it)


@dataclass
class PushReport:
    """What one push did: it becomes weights.jsonl records and a ``weights_synced`` event (driver side)."""

    version: int
    buckets: int = 0
    bytes: int = 0
    transports: dict[str, list[str]] = field(default_factory=dict)  # transport -> target sides
    trainer_checksums: dict[str, str] = field(default_factory=dict)
    # the trainer's checksums in a target's own layout ("sglang": SGLang's hashes of its parameters)
    trainer_layouts: dict[str, dict[str, str]] = field(default_factory=dict)
    target_checksums: dict[str, dict[str, str] | None] = field(default_factory=dict)  # None: not reported
    target_layouts: dict[str, str] = field(default_factory=dict)  # side -> its checksums' layout, if not relax's
    unverified: dict[str, str] = field(default_factory=dict)  # side -> why it has no checksums
    phases: dict[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Snapshot:
    """The last sync's packed buckets on the host (fault tolerance)."""

    version: int
    buckets: tuple[tuple[torch.Tensor, tuple[TensorEntry, ...]], ...]
    trainer_checksums: dict[str, str]
    trainer_layouts: dict[str, dict[str, str]]


class WeightPusher:
    """Lives in the trainer actor (rank 0): the packing buffer, the open transports, the snapshot."""

    def __init__(self, timeout_s: float = 300.0):
        self.timeout_s = timeout_s
        self._buffer: torch.Tensor | None = None
        self._open: dict[str, tuple[tuple[SyncTarget, ...], Transport]] = {}
        self.snapshot: Snapshot | None = None
        self._loop: asyncio.AbstractEventLoop | None = None  # one loop for every push: its HTTP connections persist

    def _run(self, coro):
        """Run ``coro`` on the pusher's own event loop thread (started on first use) and wait for it."""
        if self._loop is None:
            import atexit
            import threading

            self._loop = asyncio.new_event_loop()
            threading.Thread(target=self._loop.run_forever, name="relax-weight-push", daemon=True).start()
            atexit.register(self._close_session_at_exit, self._loop)
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    @staticmethod
    def _close_session_at_exit(loop: asyncio.AbstractEventLoop) -> None:
        """The actor exits (the run ended, maybe failed mid-push): close the loop's HTTP session first, so aiohttp
        does not report it unclosed on stderr after the run's last line. Bounded: a hung loop is left as it is."""
        from relax.utils.http_utils import close_session

        if loop.is_running():
            try:
                asyncio.run_coroutine_threadsafe(close_session(), loop).result(timeout=2)
            except Exception:  # noqa: BLE001 - exiting anyway
                pass

    def push(self, buckets: Iterable[NamedTensors], targets: list[SyncTarget], version: int, *, requested: str,
             weights_device: torch.device, keep_snapshot: bool = False, group_backend: str = "nccl") -> PushReport:
        return self._run(self._push(buckets, targets, version, requested, torch.device(weights_device), keep_snapshot,
                                    group_backend=group_backend))

    def resync(self, targets: list[SyncTarget]) -> PushReport:
        """Bring (restarted) ``targets`` to the snapshot's version with the snapshot's own bytes."""
        if self.snapshot is None:
            raise RuntimeError("no weight snapshot to resync from (none kept, or no sync yet)")
        snap = self.snapshot
        buckets = [unflatten(flat, entries) for flat, entries in snap.buckets]
        helper = WeightPusher(self.timeout_s)  # its own host buffer: the live GPU buffer keeps its IPC handle
        report = self._run(helper._push(buckets, targets, snap.version, "distributed", torch.device("cpu"),
                                        keep_snapshot=False, persistent=False))
        report.trainer_checksums, report.trainer_layouts = snap.trainer_checksums, snap.trainer_layouts
        return report

    def close(self) -> None:
        if self._loop is None:
            return
        from relax.utils.http_utils import close_session

        async def closing() -> None:
            await self._close_all()
            await close_session()

        self._run(closing())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop = None

    # ------------------------------------------------------------------ internals
    async def _push(self, buckets: Iterable[NamedTensors], targets: list[SyncTarget], version: int, requested: str,
                    device: torch.device, keep_snapshot: bool, persistent: bool = True,
                    group_backend: str = "nccl") -> PushReport:
        start = time.perf_counter()
        report = PushReport(version)
        plan = choose(requested, device_identity(device), targets)
        transports = [await self._transport(name, group, device, persistent, group_backend)
                      for name, group in plan.items()]
        report.transports = {name: [t.side for t in group] for name, group in plan.items()}
        prepared = time.perf_counter()
        try:
            kept = await self._send_all(buckets, transports, device, str(version), report, keep_snapshot)
        except BaseException:
            # a failed send leaves its group broken (a peer gone mid-collective): the retry opens new ones
            for transport in transports:
                with contextlib.suppress(Exception):  # the push's own error is the one to report
                    await transport.close()
            self._open.clear()
            raise
        transferred = time.perf_counter()
        await _target_checksums(targets, self.timeout_s, report)
        if keep_snapshot:
            self.snapshot = Snapshot(version, tuple(kept), report.trainer_checksums, report.trainer_layouts)
        if not persistent:
            for transport in transports:
                await transport.close()
        end = time.perf_counter()
        report.phases = {"prepare_s": prepared - start, "transfer_s": transferred - prepared,
                         "checksums_s": end - transferred}
        return report

    async def _send_all(self, buckets: Iterable[NamedTensors], transports: list[Transport], device: torch.device,
                        version: str, report: PushReport, keep_snapshot: bool) -> list:
        """Pack, send and checksum one bucket at a time. The next bucket is asked for only once the current one
        is copied into the buffer (a gathering backend may reuse its memory), before the current one is sent
        (so the last bucket is known as such)."""
        kept = []
        sglang = _sglang_layouts(self._targets(transports))
        pending = iter(buckets)
        bucket = next(pending, None)
        while bucket is not None:
            flat, entries = self._pack(bucket, device)
            bucket = next(pending, None)
            packed = PackedBucket(flat, entries, last=bucket is None)
            for t in transports:
                t.stage(packed)
            # the trainer digests the bytes it sends while the targets copy them (the buffer is read-only here)
            sums, *_ = await asyncio.gather(asyncio.to_thread(_digest_bucket, packed, sglang),
                                            *(t.send(packed, version) for t in transports))
            report.trainer_checksums.update(sums)
            if keep_snapshot:
                kept.append((packed.flat.to("cpu", copy=True), packed.entries))
            report.buckets += 1
            report.bytes += packed.nbytes
        if sglang is not None:
            report.trainer_layouts.update({layout_name(t): sglang.result(t) for t in sglang.tp_sizes})
        return kept

    @staticmethod
    def _targets(transports: list[Transport]) -> list[SyncTarget]:
        return [t for transport in transports for t in transport.targets]

    def _pack(self, bucket: NamedTensors, device: torch.device) -> tuple[torch.Tensor, tuple[TensorEntry, ...]]:
        need = layout(bucket)[-1].end_idx if bucket else 0
        if self._buffer is None or self._buffer.numel() < need or self._buffer.device != device:
            self._buffer = torch.empty(max(need, 1), dtype=torch.uint8, device=device)
        flat, entries = flatten_into(self._buffer, [(n, t.to(device)) for n, t in bucket])
        if device.type == "cuda":
            torch.cuda.current_stream(device).synchronize()  # the copies are done before another process reads
        return flat, tuple(entries)

    async def _transport(self, name: str, targets: list[SyncTarget], device: torch.device, persistent: bool,
                         group_backend: str) -> Transport:
        key = (*targets, group_backend)
        held = self._open.get(name)
        if persistent and held is not None and held[0] == key:
            return held[1]
        if persistent and held is not None:
            await held[1].close()
            del self._open[name]
        transport = TRANSPORTS[name](targets, timeout_s=self.timeout_s, group_backend=group_backend)
        await transport.open(device)
        if persistent:
            self._open[name] = (key, transport)
        return transport

    async def _close_all(self) -> None:
        for _, transport in self._open.values():
            await transport.close()
        self._open.clear()


def _sglang_layouts(targets: list[SyncTarget]) -> SGLangLayoutChecksums | None:
    """SGLang's hashes for the stock SGLang targets' sizes (those whose shards the trainer can lay out)."""
    sizes = {t.tp_size: t.kv_heads for t in targets if t.checksums == "sglang" and (t.tp_size == 1 or t.kv_heads)}
    if not sizes:
        return None
    return SGLangLayoutChecksums(tuple(sizes), next((h for h in sizes.values() if h), None))


def _digest_bucket(packed: PackedBucket, sglang: SGLangLayoutChecksums | None) -> dict[str, str]:
    """The trainer's checksums of one sent bucket (and, for stock SGLang targets, SGLang's hashes of it)."""
    named = unflatten(packed.flat, packed.entries)
    if sglang is not None:
        sglang.add(named)
    return state_checksums(named)


async def _target_checksums(targets: list[SyncTarget], timeout_s: float, report: PushReport) -> None:
    """Every target's answer to ``/weights_checker checksum``, in its own layout, into ``report``."""
    from relax.engine.rollout.engine_client import EngineClient

    reasons: dict[str, str] = {}
    for t in targets:
        if t.checksums is None:
            reasons[t.side] = "its /weights_checker answer holds no checksums the trainer can compute"
        elif t.checksums == "sglang":
            why = unverifiable(list(report.trainer_checksums), t.tp_size, t.kv_heads)
            if why:
                reasons[t.side] = why
    reading = [t for t in targets if t.side not in reasons]

    async def read(t: SyncTarget) -> dict[str, str]:
        client = EngineClient(t.url, api_key=t.api_key, weights_timeout=timeout_s)
        return await (client.sglang_checksums(t.tp_size) if t.checksums == "sglang" else client.checksums())

    sums = await asyncio.gather(*(read(t) for t in reading))
    report.target_checksums = {t.side: None for t in targets}
    report.target_checksums.update({t.side: s for t, s in zip(reading, sums, strict=True)})
    report.target_layouts = {t.side: layout_name(t.tp_size) for t in reading if t.checksums == "sglang"}
    report.unverified = reasons
