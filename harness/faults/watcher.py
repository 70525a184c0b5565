"""Tail a run's events.jsonl and fire watched faults when their trigger matches."""

from __future__ import annotations

import fnmatch
import json
import threading
import time
from pathlib import Path
from typing import Any

from harness.faults.base import FaultParams, FaultRecorder, SignalTarget


class EventTail:
    """Incremental reader of a JSON Lines file that is still being written (complete lines only)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._pos = 0
        self._buf = b""

    def read_new(self) -> list[dict[str, Any]]:
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._pos)
                chunk = fh.read()
        except FileNotFoundError:
            return []
        self._pos += len(chunk)
        self._buf += chunk
        *lines, self._buf = self._buf.split(b"\n")
        out = []
        for line in lines:
            try:
                obj = json.loads(line)
            except (json.JSONDecodeError, UnicodeDecodeError):
                continue
            if isinstance(obj, dict):
                out.append(obj)
        return out


class FaultWatcher:
    """Runs in a thread next to the run; one instance per run."""

    def __init__(self, events_path: Path, faults: list[FaultParams], target: SignalTarget,
                 recorder: FaultRecorder, poll_s: float = 0.05):
        self.tail = EventTail(events_path)
        self.pending = [f for f in faults if f.trigger_spec is not None]
        self.target, self.recorder, self.poll_s = target, recorder, poll_s
        self.pids: dict[str, int] = {}
        self.fired: list[FaultParams] = []
        self.errors: list[str] = []
        self._scheduled: list[tuple[float, FaultParams, dict[str, Any]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="fault-watcher", daemon=True)

    def start(self) -> FaultWatcher:
        if self.pending:
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        self.poll()  # a last look, so a fault due at the very end is reported as unfired, not lost

    def resolve(self, role: str) -> tuple[str, int | None] | None:
        matches = sorted(r for r in self.pids if fnmatch.fnmatchcase(r, role))
        if matches:
            return matches[0], self.pids[matches[0]]
        if role == "driver":  # the launched process itself unless the engine names its driver
            return "driver", None
        return None

    def poll(self) -> None:
        for ev in self.tail.read_new():
            # a service reached by URL (e.g. an OPD teacher given by --rm-url) has no local pid
            if ev.get("event") == "process_started" and "role" in ev and isinstance(ev.get("pid"), int):
                self.pids[str(ev["role"])] = ev["pid"]
            for fault in list(self.pending):
                trig = fault.trigger_spec
                if trig is not None and trig.matches(ev) and (ev.get("event") != "process_started"
                                                             or self.resolve(fault.role or "") is not None):
                    self.pending.remove(fault)
                    self._scheduled.append((time.monotonic() + trig.delay_s, fault, ev))
        now = time.monotonic()
        for item in [s for s in self._scheduled if s[0] <= now]:
            self._scheduled.remove(item)
            self._fire(item[1], item[2])

    def _fire(self, fault: FaultParams, ev: dict[str, Any]) -> None:
        found = self.resolve(fault.role or "")
        if found is None:
            msg = f"{fault.kind} fault: no process for role {fault.role!r} (known: {', '.join(sorted(self.pids)) or 'none'})"
            self.errors.append(msg)
            self.recorder.record(event="fault_error", kind=fault.kind, role=fault.role, reason=msg)
            return
        try:
            fault.fire(self.target, found[1], self.recorder, ev)
            self.fired.append(fault)
        except (ProcessLookupError, PermissionError, OSError) as exc:
            msg = f"{fault.kind} fault on {found[0]} (pid {found[1]}) failed: {exc}"
            self.errors.append(msg)
            self.recorder.record(event="fault_error", kind=fault.kind, role=fault.role, reason=msg)

    def _loop(self) -> None:
        while not self._stop.is_set() and (self.pending or self._scheduled):
            self.poll()
            self._stop.wait(self.poll_s)

    def unfired(self) -> list[str]:
        return [f"{f.kind} on {f.role} at {f.trigger_spec.describe()}" for f in self.pending + [s[1] for s in self._scheduled]
                if f.trigger_spec is not None]
