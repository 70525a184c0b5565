"""Engine fault tolerance (``--use-fault-tolerance``): detect, restart, re-sync, retry.

An engine is declared dead when a call to it fails with an actor error, or when a health
ping gets no answer within ``--rollout-health-check-timeout`` (a hung engine, e.g. SIGSTOP).
The supervisor then kills it by handle, starts a replacement, pushes the current weights to
it (both sides' checksums go to weights.jsonl as for any sync) and the pool re-sends the
requests that were in flight, so no sample is lost.
"""

from __future__ import annotations

import threading
import time

import ray
from ray.exceptions import GetTimeoutError, RayActorError

from relax.distributed.actors import EngineActor
from relax.distributed.placement import where
from relax.metrics import console


class EngineSupervisor:
    def __init__(self, rt, engine_options: list[dict]):
        self.rt = rt
        self.engine_options = engine_options  # per engine: its place (relax/distributed/placement.py)
        self.lock = rt.weights_lock  # one lock with the syncs: a restart never interleaves with a sync
        self.restarts = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ restart
    def replace(self, index: int, dead_handle, reason: str):
        """Replace engine ``index`` if it is still ``dead_handle``; return the live handle."""
        with self.lock:
            current = self.rt.engines[index]
            if current is not dead_handle:  # someone restarted it already
                return current
            rt, args = self.rt, self.rt.args
            rt.artifacts.event("fault_detected", role=f"engine:{index}", reason=reason)
            console.info(f"engine:{index} failed ({reason}); restarting")
            try:
                ray.kill(dead_handle, no_restart=True)
            except Exception:  # noqa: BLE001 - it may already be gone
                pass
            engine = EngineActor.options(**self.engine_options[index]).remote(args, rt.run.device, index)
            rt.artifacts.event("process_started", role=f"engine:{index}", **where(engine))
            rt.resync(index, engine)  # before it joins the pool: nothing reaches it without current weights
            rt.engines[index] = engine
            self.restarts += 1
            rt.artifacts.event("restart", role=f"engine:{index}", count=self.restarts, version=rt.version)
            return engine

    # ------------------------------------------------------------------ health checks
    def check_all(self) -> None:
        timeout = self.rt.args.rollout_health_check_timeout
        for index, engine in enumerate(list(self.rt.engines)):
            try:
                ray.get(engine.pid.remote(), timeout=timeout)
            except (GetTimeoutError, RayActorError) as exc:
                self.replace(index, engine, f"health check failed: {type(exc).__name__}")

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


def wait_for(fn, timeout: float, interval: float = 0.05):
    """Poll ``fn`` until it returns a truthy value or ``timeout`` passes (used by tests and restarts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = fn()
        if value:
            return value
        time.sleep(interval)
    return None
