"""`relax train` runs forked from a warm driver (the client half; the server is tests/driver_fork_server.py).

Why: a ``relax train`` driver spends 4.8 of its 5.7 CPU-s importing torch, transformers, Ray and relax's
driver modules before it parses a flag (a 2-step quickstart run against a shared cluster, the 2-core CI
machine), and the suite starts over a hundred drivers. One warm driver per test process imports them once
and forks a process per run. The run is still a process of its own, with the test's argv, environment,
working directory, ``sys.path``, stdout, stderr and exit code, and it runs what ``python -m relax.cli`` runs.
What it skips is the imports only.

A run differs from a fresh ``python -m relax.cli`` in one way: modules the server imported saw the server's
environment. `WarmDriver.run` therefore forks only when the run's environment differs from the server's in
variables that nothing reads at import (relax's own ``RELAX_*``, pytest's ``PYTEST_*``, ``RUN_TIME_VARIABLES``, ``RAY_ADDRESS``;
``PYTHONPATH`` the fork applies to ``sys.path``). For any other run it returns None: the caller starts a fresh
process, or a new server in that environment (tests/e2e_helpers.py).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

SERVER = Path(__file__).with_name("driver_fork_server.py")
READY_TIMEOUT_S = 120.0  # the server's imports: ~5 s alone, longer on a loaded 2-core machine
# variables read when a run starts, not at import, by any relax process (relax's own settings and fault hooks,
# pytest's, torch.distributed's rendezvous, NCCL's and gloo's group set-up); tests' in-process relax calls set some of
# them for good (relax convert: MASTER_*; start_ray: NCCL_CUMEM_ENABLE). tests/ray_worker_zygote.py shares them.
RUN_TIME_PREFIXES = ("RELAX_", "PYTEST_")
RUN_TIME_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "NCCL_CUMEM_ENABLE", "TORCH_GLOO_LAZY_INIT")
# the driver's own: Ray's address (read by ray.init) and PYTHONPATH (the fork applies it to sys.path)
_DRIVER_RUN_TIME = ("RAY_ADDRESS", "PYTHONPATH")


def _read_only_at_run_time(key: str) -> bool:
    return key.startswith(RUN_TIME_PREFIXES) or key in RUN_TIME_VARIABLES or key in _DRIVER_RUN_TIME


class WarmDriver:
    """One server process and its environment; `run` forks a run from it (one at a time)."""

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self._lock = threading.Lock()
        self._buf = b""
        self.proc = subprocess.Popen([sys.executable, str(SERVER)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env=self.env, cwd=str(Path(__file__).resolve().parents[1]))
        self._base_path: list[str] | None = None
        first = self._reply(time.monotonic() + READY_TIMEOUT_S)
        if first is None or "ready" not in first:
            self.close()
            raise RuntimeError(f"the warm driver did not start: {first}")
        self._base_path = first["path"]

    def accepts(self, env: dict[str, str]) -> bool:
        return self.alive() and not self.differences(env)

    def differences(self, env: dict[str, str]) -> list[str]:
        """The variables that ``env`` sets otherwise than the server's and that something may read at import."""
        keys = set(env) | set(self.env)
        return sorted(k for k in keys if env.get(k) != self.env.get(k) and not _read_only_at_run_time(k))

    def alive(self) -> bool:
        return self.proc.poll() is None

    def run(self, argv: list[str], env: dict[str, str], cwd: Path,
            timeout: float) -> subprocess.CompletedProcess[str] | None:
        """The run as `subprocess.run(..., capture_output=True, text=True, timeout=timeout)` reports it, or None
        when this server cannot fork it (see the module docstring) or is busy with another."""
        if not self.accepts(env) or not self._lock.acquire(blocking=False):
            return None
        try:
            return self._run(argv, env, cwd, timeout)
        finally:
            self._lock.release()

    def _run(self, argv: list[str], env: dict[str, str], cwd: Path,
             timeout: float) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "relax.cli", *argv]
        path = [str(Path(cwd).resolve()), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep)), *self._base_path]
        with tempfile.TemporaryDirectory(prefix="relax_fork_") as tmp:
            out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
            request = {"argv": argv, "env": env, "cwd": str(cwd), "path": path, "stdout": str(out), "stderr": str(err)}
            self.proc.stdin.write((json.dumps(request) + "\n").encode())
            self.proc.stdin.flush()
            deadline = time.monotonic() + timeout
            forked = self._reply(deadline)
            if forked is None or "pid" not in forked:
                raise RuntimeError(f"the warm driver did not fork the run: {forked}")
            ended = self._reply(deadline)
            if ended is None:  # the run's own timeout: kill it, as subprocess.run does, and collect its end
                os.kill(forked["pid"], 9)
                self._reply(time.monotonic() + 30)
                raise subprocess.TimeoutExpired(cmd, timeout, output=out.read_text(errors="replace"),
                                                stderr=err.read_text(errors="replace"))
            return subprocess.CompletedProcess(cmd, ended["code"], out.read_text(errors="replace"),
                                               err.read_text(errors="replace"))

    def _reply(self, deadline: float) -> dict | None:
        """The server's next reply line, or None at the deadline or when the server is gone."""
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        if self.alive():
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
