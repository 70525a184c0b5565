"""Fault registry: kill / hang a role's process, an HTTP fault proxy, engine-hook env faults, and the engine
servers a scenario starts for its run (engine_server.py), scaling a running job (elastic.py)."""

from harness.faults import elastic, engine_server, hooks, proxy, signals  # noqa: F401
from harness.faults.base import FAULTS, FaultParams, FaultRecorder, Trigger, parse_fault
from harness.faults.watcher import EventTail, FaultWatcher

__all__ = ["FAULTS", "EventTail", "FaultParams", "FaultRecorder", "FaultWatcher", "Trigger", "parse_fault"]
