"""Executor contract: start one launch of the engine and hand back a handle the runner drives."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from harness.profiles import Profile
from harness.registry import Registry
from harness.spec import Resources


@dataclass
class Launch:
    """One process launch: ``<engine command> *argv --output-dir output_dir``."""

    scenario: str
    run: str
    argv: list[str]
    output_dir: Path
    work_dir: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    resources: Resources = field(default_factory=Resources)
    timeout_s: float = 900.0
    profile: Profile = Profile.CPU
    image: str | None = None


@dataclass
class Outcome:
    exit_code: int | None
    timed_out: bool
    duration_s: float
    log_tail: str = ""
    killed_pids: list[int] = field(default_factory=list)  # leftovers the cleanup had to kill
    details: dict[str, Any] = field(default_factory=dict)


class RunHandle(ABC):
    """A started launch. ``root_pid`` is None where pids live in another namespace (containers)."""

    root_pid: int | None = None

    @abstractmethod
    def send_signal(self, pid: int | None, sig: int, *, group: bool = False) -> None:
        """Signal ``pid`` of this run (None: the launched process itself); ``group``: its whole process group, as
        ``timeout``, ``kill -- -PGID`` and job schedulers do."""

    @abstractmethod
    def poll(self) -> int | None: ...

    @abstractmethod
    def terminate(self, grace_s: float) -> None:
        """Stop everything of this run: SIGTERM, then SIGKILL after ``grace_s``."""

    @abstractmethod
    def cleanup(self) -> list[int]:
        """Remove whatever is left (processes, containers, temp dirs). Returns pids it had to kill."""

    def details(self) -> dict[str, Any]:
        return {}

    def wait(self, timeout_s: float, poll_s: float = 0.1) -> int | None:
        deadline = time.monotonic() + timeout_s
        while True:
            code = self.poll()
            if code is not None or time.monotonic() >= deadline:
                return code
            time.sleep(poll_s)


class Executor(ABC):
    name: ClassVar[str] = ""
    grace_s: float = 10.0

    def unavailable(self, profile: Profile) -> str | None:
        """Why this executor cannot run ``profile`` here (None: it can)."""
        return None

    @abstractmethod
    def start(self, launch: Launch) -> RunHandle: ...


EXECUTORS: Registry[type[Executor]] = Registry("executor")


def tail(path: Path, limit: int = 6000) -> str:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return ""
    return data[-limit:].decode("utf-8", errors="replace")
