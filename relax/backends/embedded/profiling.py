"""SGLang's ``/start_profile`` and ``/stop_profile`` on the embedded engine: torch.profiler over its forward steps.

torch.profiler records the ops of the thread that started it, so the session is started, stepped and stopped
in the scheduler's thread (the one that runs the forward steps): the HTTP handlers queue a start or a stop and
wait for the scheduler to serve it between two steps (``Scheduler`` wakes for it even when idle).

``ProfileReqInput`` (SGLang 0.5.14) as served here:

* ``output_dir``: where the Chrome trace goes (default ``$SGLANG_TORCH_PROFILER_DIR`` or ``/tmp``), as
  ``<profile_prefix->?<profile id>-TP-0.trace.json``;
* ``num_steps``: stop and write the trace after this many forward steps (None: at ``/stop_profile``);
* ``activities``: ``CPU``, ``GPU`` (CUDA activity, recorded when the engine runs on a GPU), ``MEM``
  (``profile_memory``); ``RPD`` and ``CUDA_PROFILER`` are refused;
* ``with_stack`` (None: True, as SGLang), ``record_shapes`` (None: False);
* ``profile_by_stage``, ``start_step``, ``merge_profiles`` (one rank: nothing to merge), ``profile_stages``:
  only their defaults (a request setting them is refused with one line).
"""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

ACTIVITIES = ("CPU", "GPU", "MEM")


@dataclass
class _Session:
    profiler: Any
    path: Path
    num_steps: int | None
    steps: int = 0


def _activities(names: list[str] | None, device: torch.device) -> tuple[list[Any], bool]:
    names = list(names) if names else ["CPU", "GPU"]
    unknown = [n for n in names if n not in ACTIVITIES]
    if unknown:
        raise ValueError(f"start_profile activities {', '.join(unknown)} are not implemented by this engine "
                         f"(it records {', '.join(ACTIVITIES)})")
    out = [ProfilerActivity.CPU] if "CPU" in names else []
    if "GPU" in names and device.type == "cuda":
        out.append(ProfilerActivity.CUDA)
    return out or [ProfilerActivity.CPU], "MEM" in names


def check_request(body: dict[str, Any]) -> None:
    """Refuse, in one line, what this engine does not do (the fields' defaults pass)."""
    num_steps = body.get("num_steps")
    if num_steps is not None and (not isinstance(num_steps, int) or num_steps < 1):
        raise ValueError(f"start_profile num_steps must be a positive integer or null, got {num_steps!r}")


class StepProfiler:
    """One torch.profiler session at a time over the engine's forward steps."""

    def __init__(self, device: torch.device):
        self.device = device
        self._lock = threading.Lock()
        self._queue: list[tuple[str, dict[str, Any], Future]] = []
        self._session: _Session | None = None

    @property
    def pending(self) -> bool:
        return bool(self._queue)

    @property
    def active(self) -> bool:
        return self._session is not None

    def request(self, action: str, body: dict[str, Any] | None = None) -> Future:
        """Queue ``start`` or ``stop`` for the scheduler thread; the future holds its answer (or error)."""
        if action == "start":
            check_request(body or {})
        future: Future = Future()
        with self._lock:
            self._queue.append((action, dict(body or {}), future))
        return future

    def serve(self) -> None:
        """In the scheduler thread, between two steps: run the queued starts and stops."""
        with self._lock:
            queued, self._queue = self._queue, []
        for action, body, future in queued:
            try:
                future.set_result(self._start(body) if action == "start" else self._stop())
            except Exception as exc:  # noqa: BLE001 - the caller's answer
                future.set_exception(exc)

    def after_step(self) -> None:
        """In the scheduler thread, after each forward step: stop once ``num_steps`` were recorded."""
        session = self._session
        if session is None:
            return
        session.steps += 1
        session.profiler.step()
        if session.num_steps is not None and session.steps >= session.num_steps:
            self._stop()

    def _start(self, body: dict[str, Any]) -> str:
        if self._session is not None:
            raise RuntimeError("Profiling is already in progress. Call /stop_profile first.")
        activities, memory = _activities(body.get("activities"), self.device)
        out = Path(body.get("output_dir") or os.environ.get("SGLANG_TORCH_PROFILER_DIR", "/tmp"))
        out.mkdir(parents=True, exist_ok=True)
        prefix = f"{body['profile_prefix']}-" if body.get("profile_prefix") else ""
        path = out / f"{prefix}{time.time()}-TP-0.trace.json"
        with_stack = body.get("with_stack")
        prof = profile(activities=activities, record_shapes=bool(body.get("record_shapes")),
                       with_stack=True if with_stack is None else bool(with_stack), profile_memory=memory)
        prof.start()
        self._session = _Session(prof, path, body.get("num_steps"))
        return "Start profiling.\n"

    def _stop(self) -> str:
        session, self._session = self._session, None
        if session is None:
            raise RuntimeError("Profiling is not in progress. Call /start_profile first.")
        session.profiler.stop()
        session.profiler.export_chrome_trace(str(session.path))
        return f"Stop profiling. Trace in {session.path} ({session.steps} forward steps).\n"
