"""Start an embedded engine server as a subprocess and wait until it serves.

    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3"])
    proc.url        # http://127.0.0.1:PORT
    proc.stop()     # SIGTERM, then SIGKILL after a grace period

The server prints ``relax-engine ready http://HOST:PORT`` once listening (``--port 0`` by
default here, so parallel tests never collide). The router (``module="relax.engine.router"``)
prints ``relax-router ready ...`` and starts the same way.
"""

from __future__ import annotations

import os
import re
import selectors
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

READY_LINE = re.compile(r"^relax-[a-z]+ ready (\S+)")  # engine server and router print this


@dataclass
class EngineProcess:
    proc: subprocess.Popen
    url: str
    log_path: Path

    @classmethod
    def start(cls, server_args: list[str], *, timeout: float = 120.0, log_dir: str | os.PathLike | None = None,
              env: dict[str, str] | None = None, module: str = "relax.backends.embedded.server") -> EngineProcess:
        if "--port" not in server_args:
            server_args = [*server_args, "--port", "0"]
        log_fd, log_name = tempfile.mkstemp(prefix="relax-engine-", suffix=".log", dir=log_dir)
        full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
        proc = subprocess.Popen([sys.executable, "-m", module, *server_args], stdout=subprocess.PIPE,
                                stderr=log_fd, env=full_env, text=True)
        os.close(log_fd)
        url = _wait_ready(proc, timeout, Path(log_name))
        return cls(proc, url, Path(log_name))

    @property
    def pid(self) -> int:
        return self.proc.pid

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """SIGKILL (fault injection)."""
        if self.alive():
            self.proc.kill()
        self.proc.wait(timeout=10)

    def stop(self, grace: float = 5.0) -> None:
        if self.alive():
            self.proc.terminate()
            try:
                self.proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        if self.proc.stdout:
            self.proc.stdout.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


def _wait_ready(proc: subprocess.Popen, timeout: float, log_path: Path) -> str:
    deadline = time.monotonic() + timeout
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    try:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise RuntimeError(f"engine server exited with code {proc.returncode} before serving:\n{tail}")
            if sel.select(timeout=0.2):
                m = READY_LINE.match(proc.stdout.readline())
                if m:
                    return m.group(1)
        proc.kill()
        raise RuntimeError(f"engine server did not report ready within {timeout} s (log: {log_path})")
    finally:
        sel.close()
