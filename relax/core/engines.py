"""The run's rollout engines behind one router: started, watched, replaced, stopped.

Every engine is an HTTP server speaking SGLang's API (the engine contract, DESIGN.md); how it comes
to exist is its launcher's business, one typed class per kind (`LAUNCHERS`):

* ``embedded``: our engine in a Ray actor (relax/distributed/engine_actor.py);
* ``sglang``: a real SGLang server launched by a Ray actor (relax/backends/sglang/);
* ``external``: servers the user started (``--rollout-external --rollout-external-engine-addrs``),
  embedded or SGLang, which the run drives but cannot restart.

The fleet keeps each engine's `SyncTarget` (what the trainer pushes weights to) and the router's
worker list in step: a replaced engine leaves the router before its successor joins it.
"""

from __future__ import annotations

import asyncio
import secrets
from abc import ABC, abstractmethod
from argparse import Namespace
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import ray

from relax.engine.rollout.engine_client import EngineClient, EngineError
from relax.engine.rollout.engine_pool import EngineDiedError
from relax.engine.router.in_process import RouterConfig, RouterThread
from relax.utils.arguments import ConfigError
from relax.weights.transports import SyncTarget


@dataclass
class EngineRecord:
    index: int
    target: SyncTarget
    actor: Any = None  # the Ray actor hosting it; None for an external engine
    pid: int | None = None
    node: str | None = None


def _run(coro):
    from relax.utils.http_utils import close_session

    async def main():
        try:
            return await coro
        finally:
            await close_session()

    return asyncio.run(main())


class EngineLauncher(ABC):
    """Starts (or attaches to) engine ``index``; ``can_restart``: a dead one can be replaced."""

    name: ClassVar[str]
    can_restart: ClassVar[bool] = True

    def __init__(self, args: Namespace, device: str, actor_options: dict, *, host: str, api_key: str | None):
        self.args, self.device, self.actor_options = args, device, actor_options
        self.host, self.api_key = host, api_key

    @abstractmethod
    def count(self) -> int:
        """How many engines the run has."""

    @abstractmethod
    def begin(self, indices: list[int]) -> Any:
        """Start these engines without waiting (the trainer loads meanwhile); `finish` waits for them."""

    @abstractmethod
    def finish(self, pending: Any) -> list[EngineRecord]:
        """Wait until every engine `begin` started serves; their records."""

    def start_all(self, indices: list[int]) -> list[EngineRecord]:
        return self.finish(self.begin(indices))


class EmbeddedLauncher(EngineLauncher):
    name = "embedded"

    def __init__(self, *args: Any, replicas: int, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.replicas = replicas

    def count(self) -> int:
        return self.replicas

    def begin(self, indices: list[int]) -> Any:
        from relax.distributed.engine_actor import EngineActor

        return indices, [EngineActor.options(**self.actor_options).remote(self.args, self.device, i, self.host,
                                                                          self.api_key) for i in indices]

    def finish(self, pending: Any) -> list[EngineRecord]:
        indices, actors = pending
        answers = ray.get([a.endpoint.remote() for a in actors])
        pids = ray.get([a.pid.remote() for a in actors])
        return [EngineRecord(i, SyncTarget(f"engine:{i}", url, device, api_key=self.api_key), actor, pid)
                for i, actor, (url, device), pid in zip(indices, actors, answers, pids, strict=True)]


class ExternalEngines(EngineLauncher):
    """``--rollout-external-engine-addrs host:port ...``: servers the user runs; probed, never restarted."""

    name = "external"
    can_restart = False

    def count(self) -> int:
        return len(self.args.rollout_external_engine_addrs or [])

    def begin(self, indices: list[int]) -> Any:
        return indices

    def finish(self, pending: Any) -> list[EngineRecord]:
        return [self._attach(i, self.args.rollout_external_engine_addrs[i]) for i in pending]

    def _attach(self, index: int, address: str) -> EngineRecord:
        url = address if "://" in address else f"http://{address}"
        client = EngineClient(url, control_timeout=10)
        try:
            info = _run(client.server_info())
        except EngineError as exc:
            raise ConfigError(f"--rollout-external-engine-addrs {address}: engine unreachable ({exc})") from None
        ours = info.get("relax_engine") if isinstance(info, dict) else None
        device = ours.get("device", "unknown") if isinstance(ours, dict) else "unknown"
        return EngineRecord(index, SyncTarget(f"engine:{index}", url, device, reports_checksums=ours is not None,
                                              tp_size=int(info.get("tp_size", 1) or 1)))


LAUNCHERS: dict[str, type[EngineLauncher]] = {cls.name: cls for cls in (EmbeddedLauncher, ExternalEngines)}


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
    def begin(cls, args: Namespace, device: str, actor_options: dict, replicas: int) -> tuple[EngineLauncher, Any]:
        """Launch the engines (``--rollout-external``: attach; else ``--rollout-backend``) without waiting."""
        host, api_key = _bind() if not args.rollout_external else ("127.0.0.1", None)
        kind = "external" if args.rollout_external else args.rollout_backend
        launcher_cls = LAUNCHERS[kind]
        kwargs = {"replicas": replicas} if launcher_cls is EmbeddedLauncher else {}
        launcher = launcher_cls(args, device, actor_options, host=host, api_key=api_key, **kwargs)
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
        return [self.client(i, **kwargs) for i in range(len(self.records))]

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

    def drop(self, index: int) -> None:
        """Take an engine that cannot be restarted out of the run (router and weight syncs)."""
        record = self.records[index]
        self.router.remove_worker(record.target.url)
        self.records[index] = replace(record, target=replace(record.target, side=f"gone:{index}"))

    def live_targets(self) -> list[SyncTarget]:
        return [r.target for r in self.records if not r.target.side.startswith("gone:")]

    def failure(self, exc: BaseException) -> EngineDiedError:
        """One line naming the engine behind ``exc`` (a dead or hung engine, fault tolerance off): the engine
        whose URL the error names, else the first that no longer answers ``/health``."""
        text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        culprit = next((r for r in self.records if r.target.url in str(exc)), None)
        if culprit is None:
            healthy = _run(asyncio.gather(*(self.client(i).health(timeout=2.0) for i in range(len(self.records)))))
            culprit = next((r for r, ok in zip(self.records, healthy, strict=True) if not ok), None)
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
