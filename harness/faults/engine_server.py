"""Not a fault: an embedded engine server (``relax serve-engine``'s process) that a scenario starts before
its run and stops after it, so the run can train against engines it did not start (``--rollout-external``).

Flags name it ``{server:NAME}`` (``http://127.0.0.1:PORT``), and an ``http_proxy`` listed after it may sit
in front of it (``target: "{server:NAME}"``). It lives in the fault registry because it has the same life
cycle as a proxy: started before the launch, stopped after the run, its start recorded in events.jsonl.
"""

from __future__ import annotations

from typing import Any, Literal

from harness.faults.base import FaultParams, FaultRecorder, register


@register("engine_server")
class EngineServerParams(FaultParams):
    kind: Literal["engine_server"] = "engine_server"
    name: str = "engine"
    server_args: list[str] = ["--hf-checkpoint", "tiny-qwen3"]  # python -m relax.backends.embedded.server ...
    start_timeout_s: float = 180.0

    _proc: Any = None

    def start(self, recorder: FaultRecorder) -> dict[str, str]:
        from relax.backends.embedded.launch import EngineProcess

        self._proc = EngineProcess.start(self.server_args, timeout=self.start_timeout_s)
        recorder.record(event="server_started", kind=self.kind, name=self.name, url=self._proc.url,
                        pid=self._proc.pid, log=str(self._proc.log_path))
        return {f"server:{self.name}": self._proc.url}

    def stop(self) -> dict[str, Any]:
        if self._proc is None:
            return {}
        self._proc.stop()
        return {"server": self.name, "log": str(self._proc.log_path)}
