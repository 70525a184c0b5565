"""Continuous batching: one thread steps the engine while callers submit and abort requests.

Concurrent ``submit`` calls share decode steps: each ``EmbeddedEngine.step`` admits whatever
has arrived since the last step and retires whatever finished, so requests join and leave the
running batch at token granularity. Determinism is per request (each owns its seeded
generator), so batch composition never changes a seeded request's tokens.

Control operations (weight updates, release/resume) run through ``exclusive()``: the loop
finishes its current step, waits, and resumes afterwards. ``pause()`` stops stepping with
requests kept in place (their KV cache survives) until ``resume()``.
The same scheduler runs on CPU (eager) and GPU; only the engine's device differs.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from concurrent.futures import Future
from typing import Any

from relax.backends.embedded.engine import EmbeddedEngine, Request
from relax.backends.embedded.profiling import StepProfiler

log = logging.getLogger(__name__)


class EngineStepError(Exception):
    """A decode step raised; every request in flight at that moment fails with this."""


class Scheduler:
    def __init__(self, engine: EmbeddedEngine):
        self.engine = engine
        self._cond = threading.Condition()
        self._engine_lock = threading.Lock()
        self._futures: dict[str, tuple[Request, Future]] = {}
        self._paused = False
        self._exclusive_waiters = 0
        self._stopped = False
        self.steps = 0
        self.profiler = StepProfiler(engine.device)  # /start_profile, /stop_profile: run in this loop's thread
        self._thread = threading.Thread(target=self._loop, name="engine-scheduler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ requests
    def submit(self, request: dict[str, Any]) -> Future:
        """Queue one SGLang-shaped request; the future resolves to its response dict.

        Raises ``ValueError`` (bad request) or ``RuntimeError`` (engine released) immediately.
        """
        return self.submit_many([request])[0]

    def submit_many(self, requests: list[dict[str, Any]]) -> list[Future]:
        """Validate all first, so a bad one rejects the batch without starting any."""
        with self._engine_lock:
            if self.engine.released:
                raise RuntimeError("engine memory is released; call resume_memory_occupation first")
            reqs = [self.engine.make_request(q) for q in requests]
            rids = [r.rid for r in reqs]
            taken = sorted({rid for rid in rids if rid in self._futures or rids.count(rid) > 1})
            if taken:
                raise ValueError(f"request id(s) already in use: {', '.join(taken)}")
            futures = []
            for r in reqs:
                self.engine.add_request(r)
                futures.append(Future())
                futures[-1].rid = r.rid  # type: ignore[attr-defined]
                self._futures[r.rid] = (r, futures[-1])
        self._wake()
        return futures

    def abort(self, rid: str | None = None, *, abort_all: bool = False, message: str | None = None) -> int:
        """Abort one request (by rid) or all; their futures resolve to partial responses."""
        with self._engine_lock:
            hit = self.engine.abort(rid, abort_all=abort_all, message=message)
            self._resolve(hit)
        return len(hit)

    def num_outstanding(self) -> int:
        return len(self._futures)

    # ------------------------------------------------------------------ control
    @property
    def paused(self) -> bool:
        return self._paused

    def pause(self) -> None:
        with self._cond:
            self._paused = True
        with self._engine_lock:  # returns once the in-flight step is over
            pass

    def resume(self) -> None:
        with self._cond:
            self._paused = False
            self._cond.notify_all()

    @contextlib.contextmanager
    def exclusive(self) -> Iterator[EmbeddedEngine]:
        """Hold the engine between steps (generation waits, requests keep their place)."""
        with self._cond:
            self._exclusive_waiters += 1
        try:
            with self._engine_lock:
                yield self.engine
        finally:
            with self._cond:
                self._exclusive_waiters -= 1
                self._cond.notify_all()

    def profile(self, action: str, body: dict[str, Any] | None = None) -> Future:
        """``start`` or ``stop`` a torch.profiler session between two steps, in the stepping thread."""
        future = self.profiler.request(action, body)
        self._wake()
        return future

    def close(self) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        self._thread.join(timeout=10)
        self.abort(abort_all=True)

    # ------------------------------------------------------------------ loop
    def _wake(self) -> None:
        with self._cond:
            self._cond.notify_all()

    def _can_step(self) -> bool:
        return not self._paused and not self._exclusive_waiters and self.engine.has_work()

    def _runnable(self) -> bool:
        return self.profiler.pending or self._can_step()

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and not self._runnable():
                    self._cond.wait()
                if self._stopped:
                    return
            with self._engine_lock:
                self.profiler.serve()
                if not self._can_step():
                    continue
                try:
                    finished = self.engine.step()
                    self.steps += 1
                except Exception as exc:  # a failing step fails its requests, not the server
                    log.exception("engine step failed")
                    self._fail_all(exc)
                    continue
                try:
                    self.profiler.after_step()  # /start_profile's num_steps: stops and writes the trace
                except Exception:  # a trace that cannot be written fails no request
                    log.exception("writing the profiler's trace failed")
                self._resolve(finished)

    def _resolve(self, reqs: list[Request]) -> None:
        entries = [self._futures.pop(r.rid, None) for r in reqs]
        waiting = [(r, entry[1]) for r, entry in zip(reqs, entries, strict=True)
                   if entry is not None and not entry[1].done()]
        responses = self.engine.responses([r for r, _ in waiting])  # texts decoded together
        for (_, future), response in zip(waiting, responses, strict=True):
            future.set_result(response)

    def _fail_all(self, exc: BaseException) -> None:
        """Fail every request in flight: the engine's queues and also those the step had admitted but not yet
        placed in its batch (a prefill that raised), which no queue holds any more and would never resolve."""
        self.engine.abort(abort_all=True)
        error = EngineStepError(f"engine step failed: {type(exc).__name__}: {exc}")
        for rid in list(self._futures):
            _, future = self._futures.pop(rid)
            if not future.done():
                future.set_exception(error)
