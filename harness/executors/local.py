"""Local executor: the engine as a subprocess in its own session (process group).

Every launch gets its own Ray temp dir (``RELAX_RAY_TEMP_DIR``, short, under /tmp). The handle
keeps a snapshot of the process tree while the run lives (Ray daemons may outlive and escape the
group); cleanup kills the group, then every remembered pid that is still the same process
(pid + create time), SIGTERM then SIGKILL. Nothing is ever killed by name.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from harness.executors.base import EXECUTORS, Executor, Launch, RunHandle

ENGINE_CMD = [sys.executable, "-m", "relax.cli", "train"]
REPO_ROOT = Path(__file__).resolve().parents[2]
BASE_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class LocalHandle(RunHandle):
    def __init__(self, popen: subprocess.Popen, ray_dir: Path, log_fh):
        self.popen = popen
        self.root_pid = popen.pid
        self.pgid = popen.pid  # start_new_session: the child leads its own group
        self.ray_dir = ray_dir
        self._log_fh = log_fh
        self.tracked: dict[int, psutil.Process] = {}
        self._snapshot()

    def _snapshot(self) -> None:
        try:
            root = psutil.Process(self.root_pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return
        for p in procs:
            self.tracked.setdefault(p.pid, p)  # psutil.Process remembers create_time: no pid-reuse mistakes

    def send_signal(self, pid: int | None, sig: int, *, group: bool = False) -> None:
        target = self.root_pid if pid is None else pid
        if group:
            os.killpg(os.getpgid(target), sig)
        else:
            os.kill(target, sig)

    def poll(self) -> int | None:
        code = self.popen.poll()
        if code is None:
            self._snapshot()
        return code

    def _killpg(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pgid, sig)

    def _survivors(self) -> list[psutil.Process]:
        return [p for p in self.tracked.values() if p.pid != self.root_pid and _alive(p)]

    def terminate(self, grace_s: float) -> None:
        self._snapshot()
        self._killpg(signal.SIGCONT)  # a stopped process cannot act on SIGTERM
        self._killpg(signal.SIGTERM)
        try:
            self.popen.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            pass
        self._killpg(signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=5)

    def cleanup(self, grace_s: float = 3.0) -> list[int]:
        if self.popen.poll() is None:
            self.terminate(grace_s)
        self._killpg(signal.SIGKILL)  # group members left behind by a clean exit
        survivors = self._survivors()
        killed = [p.pid for p in survivors]
        for p in survivors:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(survivors, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        with contextlib.suppress(Exception):
            self._log_fh.close()
        shutil.rmtree(self.ray_dir, ignore_errors=True)
        return killed

    def details(self) -> dict:
        return {"pid": self.root_pid, "pgid": self.pgid, "tracked_pids": sorted(self.tracked),
                "ray_temp_dir": str(self.ray_dir)}


@EXECUTORS.register("local")
class LocalExecutor(Executor):
    name = "local"

    def __init__(self, engine_cmd: list[str] | None = None, grace_s: float = 10.0, code_root: Path | None = None):
        """``code_root``: the checkout whose ``relax`` the runs import (first on PYTHONPATH; default this one,
        the A/B gate passes a worktree of the base commit)."""
        self.engine_cmd = list(engine_cmd or ENGINE_CMD)
        self.grace_s = grace_s
        self.code_root = Path(code_root or REPO_ROOT)

    def command(self, launch: Launch) -> list[str]:
        return [*self.engine_cmd, *launch.argv, "--output-dir", str(launch.output_dir)]

    def start(self, launch: Launch) -> LocalHandle:
        launch.output_dir.mkdir(parents=True, exist_ok=True)
        launch.work_dir.mkdir(parents=True, exist_ok=True)
        ray_dir = Path(tempfile.mkdtemp(prefix="rh", dir="/tmp"))  # AF_UNIX paths must stay short
        env = {**os.environ, **BASE_ENV, **launch.env, "RELAX_RAY_TEMP_DIR": str(ray_dir)}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.code_root), env.get("PYTHONPATH")) if p)
        log_fh = open(launch.log_path, "ab")  # noqa: SIM115 - closed by the handle's cleanup
        log_fh.write(f"$ {' '.join(self.command(launch))}\n".encode())
        log_fh.flush()
        popen = subprocess.Popen(self.command(launch), stdout=log_fh, stderr=subprocess.STDOUT,
                                 stdin=subprocess.DEVNULL, cwd=launch.work_dir, env=env, start_new_session=True)
        time.sleep(0)  # let the child start before the first snapshot
        return LocalHandle(popen, ray_dir, log_fh)
