"""Engine fault tolerance (``--use-fault-tolerance``): detect, restart, re-sync, retry.

An engine is declared dead when its ``/health`` gets no answer within
``--rollout-health-check-timeout`` (killed, hung: e.g. SIGSTOP) or its hosting actor is gone. The
supervisor then takes it out of the router, kills it, starts a replacement, pushes it the last
sync's own bytes (the trainer keeps them: `relax.weights.push.WeightPusher.resync`; both sides'
checksums go to weights.jsonl as for any sync) and only then puts it behind the router again, so no
request reaches an engine without current weights. Requests that were in flight are retried (the
router retries them on another live engine; the rollout pool after the replacement), so no sample
is lost. An engine the run cannot restart (``--rollout-external``) is dropped instead: the router
and the syncs go on with the others.
"""

from __future__ import annotations

import asyncio
import threading
import time

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from relax.distributed.placement import where
from relax.engine.rollout.engine_client import EngineClient
from relax.engine.rollout.engine_pool import EngineDiedError
from relax.metrics import console
from relax.utils.http_utils import run_closing


class EngineSupervisor:
    def __init__(self, rt):
        self.rt = rt
        self.lock = rt.weights_lock  # one lock with the syncs: a restart never interleaves with a sync
        self.restarts = 0
        self.fatal: str | None = None  # set once every engine failed and none could be restarted
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ restart
    def replace(self, index: int, url: str, reason: str) -> None:
        """Restart engine ``index``, if it is still the one at ``url`` that failed (several callers may see one
        failure), or drop it when it cannot be restarted."""
        rt, fleet = self.rt, self.rt.fleet
        with self.lock:
            if fleet.records[index].target.url != url or fleet.records[index].target.side.startswith("gone:"):
                return  # replaced (or dropped) already
            rt.artifacts.event("fault_detected", role=f"engine:{index}", reason=reason)
            if not fleet.launcher.can_restart:
                fleet.drop(index)
                console.info(f"engine:{index} failed ({reason}); {fleet.launcher.name} engines cannot be restarted: "
                             "going on with the others")
                if not fleet.live_targets():
                    self.fatal = f"every engine failed; the last: engine:{index} ({url}): {reason}"
                    raise EngineDiedError(self.fatal)
                rt.artifacts.event("engine_dropped", role=f"engine:{index}", reason=reason)
                return
            console.info(f"engine:{index} failed ({reason}); restarting")
            record = fleet.replace(index)  # the successor takes the same placement slot
            where_ = where(record.actor) if record.actor is not None else {}
            rt.artifacts.event("process_started", role=f"engine:{index}", url=record.target.url,
                               **{**where_, "pid": record.pid})
            rt.resync(index)  # before it joins the router: nothing reaches it without current weights
            fleet.admit(index)
            self.restarts += 1
            rt.artifacts.event("restart", role=f"engine:{index}", count=self.restarts, version=rt.version)

    # ------------------------------------------------------------------ health checks
    def check_all(self) -> None:
        """Probe every engine now; replace the ones that fail. Once every engine is gone (none could be
        restarted) each call raises, so the rollout or sync that asked ends the run with that one line."""
        if self.fatal is not None:
            raise EngineDiedError(self.fatal)
        failures = self._probe()
        for index, url, reason in failures:
            self.replace(index, url, reason)

    def _probe(self) -> list[tuple[int, str, str]]:
        timeout = float(self.rt.args.rollout_health_check_timeout)
        records = [r for r in self.rt.fleet.records if not r.target.side.startswith("gone:")]

        async def probe() -> list[bool]:
            return await asyncio.gather(*(EngineClient(r.target.url, api_key=r.target.api_key).health(timeout)
                                          for r in records))

        healthy = run_closing(probe())
        failures = []
        for record, ok in zip(records, healthy, strict=True):
            if not ok:
                failures.append((record.index, record.target.url, f"no /health answer within {timeout} s"))
            elif record.actor is not None and not _actor_alive(record.actor, timeout):
                failures.append((record.index, record.target.url, "its actor is gone"))
        return failures

    def start(self) -> None:
        args = self.rt.args

        def loop() -> None:
            if self._stop.wait(args.rollout_health_check_first_wait):
                return
            while not self._stop.wait(args.rollout_health_check_interval):
                try:
                    self.check_all()
                except Exception as exc:  # noqa: BLE001 - a failed restart is reported, the loop goes on
                    self.rt.artifacts.event("fault_detected", role="supervisor", reason=str(exc)[:200])

        self._thread = threading.Thread(target=loop, name="relax-health", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def _actor_alive(actor, timeout: float) -> bool:
    try:
        ray.get(actor.pid.remote(), timeout=timeout)
        return True
    except (GetTimeoutError, RayActorError):
        return False


def wait_for(fn, timeout: float, interval: float = 0.05):
    """Poll ``fn`` until it returns a truthy value or ``timeout`` passes (used by tests and restarts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    return None
