"""Process faults by signal, aimed at a role's pid from ``process_started`` events."""

from __future__ import annotations

import signal
import threading
import time
from typing import Any, Literal

from harness.faults.base import FaultParams, FaultRecorder, SignalTarget, Trigger, register


@register("kill")
class KillFault(FaultParams):
    """SIGKILL (or another signal) to the process of ``role`` when the trigger matches."""

    kind: Literal["kill"] = "kill"
    target_role: str  # "engine:0", "trainer:0", "driver", or a glob like "engine:*"
    at: Trigger = Trigger()
    signal: str = "SIGKILL"
    group: bool = False  # the target's whole process group (a terminal's Ctrl-C, `timeout`, a scheduler)
    repeat: int = 1  # how many times (a second Ctrl-C during the shutdown), interval_s apart
    interval_s: float = 0.3

    @property
    def trigger_spec(self) -> Trigger:
        return self.at

    @property
    def role(self) -> str:
        return self.target_role

    def fire(self, target: SignalTarget, pid: int | None, recorder: FaultRecorder, ev: dict[str, Any]) -> None:
        sig = signal.Signals[self.signal]
        for i in range(self.repeat):
            if i:
                time.sleep(self.interval_s)
            try:
                target.send_signal(pid, sig, group=self.group)
            except ProcessLookupError:
                if i == 0:
                    raise
                break  # the run already ended: a repeat has nothing left to hurry
            recorder.record(kind=self.kind, role=self.target_role, pid=pid, signal=sig.name, step=ev.get("step"),
                            trigger=self.at.describe(), group=self.group, repeat=i + 1)


@register("hang")
class HangFault(FaultParams):
    """SIGSTOP the role's process for ``duration_s``, then SIGCONT (an engine hang / slow node)."""

    kind: Literal["hang"] = "hang"
    target_role: str
    at: Trigger = Trigger()
    duration_s: float = 5.0

    _timer: threading.Timer | None = None
    _resume: Any = None

    @property
    def trigger_spec(self) -> Trigger:
        return self.at

    @property
    def role(self) -> str:
        return self.target_role

    def fire(self, target: SignalTarget, pid: int | None, recorder: FaultRecorder, ev: dict[str, Any]) -> None:
        target.send_signal(pid, signal.SIGSTOP)
        recorder.record(kind=self.kind, role=self.target_role, pid=pid, signal="SIGSTOP", step=ev.get("step"),
                        duration_s=self.duration_s, trigger=self.at.describe())

        def resume() -> None:
            if self._resume is None:
                return
            self._resume = None
            try:
                target.send_signal(pid, signal.SIGCONT)
                recorder.record(event="fault_cleared", kind=self.kind, role=self.target_role, pid=pid,
                                signal="SIGCONT")
            except ProcessLookupError:
                pass

        self._resume = resume
        self._timer = threading.Timer(self.duration_s, resume)
        self._timer.daemon = True
        self._timer.start()

    def stop(self) -> dict[str, Any]:
        if self._timer is not None:
            self._timer.cancel()
        if self._resume is not None:  # never leave a stopped process behind
            self._resume()
        return {}
