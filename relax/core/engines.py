"""The run's rollout engines behind one router: started, watched, replaced, stopped.

Every engine is an HTTP server speaking SGLang's API (the engine contract, DESIGN.md); how it comes
to exist is its launcher's business (relax/core/engine_launchers.py: embedded, sglang, external).

The fleet keeps each engine's `SyncTarget` (what the trainer pushes weights to) and the router's
worker list in step: a replaced engine leaves the router before its successor joins it.
"""

from __future__ import annotations

import asyncio
import secrets
from argparse import Namespace
from dataclasses import replace
from typing import Any

import ray

from relax.core.engine_launchers import launcher_class
from relax.engine.launcher import EngineLauncher, EngineRecord
from relax.engine.rollout.engine_client import EngineClient
from relax.engine.rollout.engine_pool import EngineDiedError
from relax.engine.router.in_process import RouterConfig, RouterThread
from relax.utils.errors import unwrap
from relax.utils.http_utils import run_closing
from relax.weights.transports import SyncTarget


def _bind() -> tuple[str, str | None]:
    """Loopback when the whole cluster is this machine; else each engine's node address ("node") with a
    run-wide API key (servers off loopback take requests only with it)."""
    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len({n.get("NodeManagerAddress") for n in nodes}) <= 1:
        return "127.0.0.1", None
    return "node", secrets.token_hex(16)


class EngineFleet:
    def __init__(self, launcher: EngineLauncher, records: list[EngineRecord], router: RouterThread):
        self.launcher = launcher
        self.records = records
        self.router = router

    @classmethod
    def begin(cls, args: Namespace, device: str, slots: list) -> tuple[EngineLauncher, Any]:
        """Launch the engines (``--rollout-external``: attach; else ``--rollout-backend``, one per placement slot)
        without waiting."""
        host, api_key = _bind() if not args.rollout_external else ("127.0.0.1", None)
        kind = "external" if args.rollout_external else args.rollout_backend
        launcher_cls = launcher_class(kind)
        launcher = launcher_cls(launcher_cls.config_class.from_args(args), device, slots, host=host, api_key=api_key)
        return launcher, launcher.begin(list(range(launcher.count())))

    @classmethod
    def finish(cls, args: Namespace, launcher: EngineLauncher, pending: Any) -> EngineFleet:
        """Wait for the engines `begin` launched and put them behind the run's router."""
        records = launcher.finish(pending)
        router = RouterThread([r.target.url for r in records], RouterConfig.from_args(args),
                              worker_api_key=launcher.api_key)
        return cls(launcher, records, router)

    def __len__(self) -> int:
        return len(self.records)

    def targets(self) -> list[SyncTarget]:
        return [r.target for r in self.records]

    def client(self, index: int, **kwargs: Any) -> EngineClient:
        target = self.records[index].target
        return EngineClient(target.url, api_key=target.api_key, **kwargs)

    def clients(self, **kwargs: Any) -> list[EngineClient]:
        """Clients of the engines still in the run (`live_records`)."""
        return [self.client(r.index, **kwargs) for r in self.live_records()]

    def replace(self, index: int) -> EngineRecord:
        """Kill engine ``index`` and start its successor (not yet in the router: the caller resyncs it first)."""
        old = self.records[index]
        self.router.remove_worker(old.target.url)
        if old.actor is not None:
            try:
                ray.kill(old.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - it may already be gone
                pass
        new = self.launcher.start_all([index])[0]
        self.records[index] = new
        return new

    def admit(self, index: int) -> None:
        """Put engine ``index`` (back) behind the router."""
        self.router.add_worker(self.records[index].target.url)

    def new_indices(self, count: int) -> list[int]:
        """Indices for ``count`` joining engines: never one an engine of this run had before."""
        start = max(len(self.records), len(self.launcher.slots))
        return list(range(start, start + count))

    def join(self, record: EngineRecord) -> None:
        """Add a started engine that holds the current weights to the run: its syncs, then the router."""
        while len(self.records) < record.index:  # an index a failed scale-out used: never in the run
            gap = len(self.records)
            self.records.append(EngineRecord(gap, SyncTarget(f"gone:{gap}", "", "none")))
        if record.index < len(self.records):
            self.records[record.index] = record
        else:
            self.records.append(record)
        self.admit(record.index)

    def drop(self, index: int) -> None:
        """Take an engine that cannot be restarted out of the run (router and weight syncs)."""
        record = self.records[index]
        self.router.remove_worker(record.target.url)
        self.records[index] = replace(record, target=replace(record.target, side=f"gone:{index}"))

    def live_records(self) -> list[EngineRecord]:
        """The engines still in the run (a dropped external engine is not)."""
        return [r for r in self.records if not r.target.side.startswith("gone:")]

    def live_targets(self) -> list[SyncTarget]:
        return [r.target for r in self.live_records()]

    def failure(self, exc: BaseException) -> EngineDiedError:
        """One line naming the engine behind ``exc`` (a dead or hung engine, fault tolerance off): the engine
        whose URL the error names, else the first that no longer answers ``/health``."""
        exc, _ = unwrap(exc)  # an engine's error raised in the trainer (a weight push): Ray wraps it
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        culprit = next((r for r in self.records if r.target.url in str(exc)), None)
        if culprit is None:
            async def ask_all() -> list:  # gather inside the loop: no event loop exists in this thread
                return await asyncio.gather(*(self.client(r.index).health(timeout=2.0) for r in live))

            live = self.live_records()
            healthy = run_closing(ask_all())
            culprit = next((r for r, ok in zip(live, healthy, strict=True) if not ok), None)
        who = f"engine:{culprit.index} ({culprit.target.url})" if culprit is not None else "an engine"
        return EngineDiedError(f"{who} failed: {text}; rerun with --use-fault-tolerance to restart engines")

    def actors(self) -> list:
        return [r.actor for r in self.records if r.actor is not None]

    def shutdown(self) -> None:
        for actor in self.actors():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already dead
                pass
