"""Fault contract: declarative params (pydantic) that the runner executes from outside the engine."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, ConfigDict

from harness.registry import Registry


class Trigger(BaseModel):
    """When a watched fault fires, read from the run's events.jsonl.

    ``step`` alone: at the first ``step_start`` with step >= N. With ``phase``: at the ``phase``
    event of that phase (and step, if given). ``event``: at any event of that name (and step).
    Nothing: as soon as the target role has a pid. ``delay_s`` waits after the match.
    """

    model_config = ConfigDict(extra="forbid")
    step: int | None = None
    phase: Literal["rollout", "train", "sync", "checkpoint"] | None = None
    event: str | None = None
    delay_s: float = 0.0

    def matches(self, ev: dict[str, Any]) -> bool:
        name, step = ev.get("event"), ev.get("step")
        step_ok = self.step is None or (isinstance(step, int) and step == self.step)
        if self.event:
            return name == self.event and step_ok
        if self.phase:
            return name == "phase" and ev.get("phase") == self.phase and step_ok
        if self.step is not None:
            return name == "step_start" and isinstance(step, int) and step >= self.step
        return name == "process_started"

    def describe(self) -> str:
        parts = [f"event {self.event}"] if self.event else []
        parts += [f"phase {self.phase}"] if self.phase else []
        parts += [f"step {self.step}"] if self.step is not None else []
        return " ".join(parts) or "start"


class SignalTarget(Protocol):
    """What the executor's run handle offers faults: signal a pid of the run (in its namespace)."""

    root_pid: int | None

    def send_signal(self, pid: int | None, sig: int, *, group: bool = False) -> None: ...


class FaultRecorder:
    """Appends ``fault_injected`` records to events.jsonl (one O_APPEND write per line) and keeps them."""

    def __init__(self, events_path: Path):
        self.events_path = Path(events_path)
        self.records: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def record(self, event: str = "fault_injected", *, fault: bool = True, **fields: Any) -> dict[str, Any]:
        """Append an event to events.jsonl; ``fault``: it is also one of the faults' records (the run's result
        lists them), not the harness's own bookkeeping (``launch_cleanup``)."""
        rec = {"time": time.time(), "event": event, "source": "harness", **fields}
        data = (json.dumps(rec) + "\n").encode()
        with self._lock:
            if fault:
                self.records.append(rec)
            self.events_path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.events_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, data)
            finally:
                os.close(fd)
        return rec


class FaultParams(BaseModel):
    """Base of every fault. Subclasses declare fields and override the hooks they need."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    run: str | None = None  # which run of the scenario (None: the first)
    kind_name: ClassVar[str] = ""

    @property
    def trigger_spec(self) -> Trigger | None:
        """A trigger makes the fault watched (fired by the events watcher)."""
        return None

    def env(self) -> dict[str, str]:
        """Environment for the engine process (engine-hook faults)."""
        return {}

    def resolve(self, values: dict[str, str]) -> FaultParams:
        """This fault with placeholders in its own fields filled (values of the faults started before it)."""
        return self

    def start(self, recorder: FaultRecorder) -> dict[str, str]:
        """Before launch; returns flag placeholders (e.g. ``proxy:NAME`` -> address)."""
        return {}

    def stop(self) -> dict[str, Any]:
        """After the run; returns stats for the result."""
        return {}

    def fire(self, target: SignalTarget, pid: int | None, recorder: FaultRecorder, ev: dict[str, Any]) -> None:
        raise NotImplementedError

    @property
    def role(self) -> str | None:
        return None


FAULTS: Registry[type[FaultParams]] = Registry("fault")


def register(kind: str):
    def deco(cls: type[FaultParams]) -> type[FaultParams]:
        cls.kind_name = kind
        FAULTS.add(kind, cls)
        return cls

    return deco


def parse_fault(data: Any) -> FaultParams:
    if isinstance(data, FaultParams):
        return data
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError(f"a fault needs a 'kind' (one of {', '.join(FAULTS.names())}); got {data!r}")
    try:
        cls = FAULTS.get(data["kind"])
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return cls.model_validate(data)
