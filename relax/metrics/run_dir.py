"""One run per output directory: a live run holds ``<output-dir>/.relax.lock``; a finished one leaves run.json.

A second run on a directory a live run holds is refused, naming that run's pid, host and start. A directory
holding a finished run's artifacts is refused too, unless the new run resumes it (``--load``: it appends to
the same files, and says so) or ``--overwrite-output-dir`` replaces them. Before this, two runs on one
directory both exited 0 with their metrics interleaved and the first run.json overwritten.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import time
from pathlib import Path

from relax.utils.flag_types import ConfigError

LOCK_FILE = ".relax.lock"
ARTIFACTS = ("metrics.jsonl", "weights.jsonl", "events.jsonl", "samples.jsonl", "run.json")


class RunDirLock:
    """Held for the run's life (the lock goes with the process, whatever way it ends)."""

    def __init__(self, fd: int, path: Path):
        self.fd, self.path = fd, path

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                fcntl.flock(self.fd, fcntl.LOCK_UN)
                os.close(self.fd)
            self.fd = -1


def claim_run_dir(directory: str | os.PathLike[str], *, resuming: bool, overwrite: bool) -> tuple[RunDirLock, str | None]:
    """Lock ``directory`` for this run; returns the lock and a notice (appending to a resumed run's files),
    or raises `ConfigError` with one line: in use by another run, or holding a finished one."""
    root = Path(directory)
    try:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        from relax.utils.file_checks import writable_dir_problem

        reason = writable_dir_problem(root) or exc.strerror  # why, in the file system's terms (read-only, a file)
        raise ConfigError(f"--output-dir {root}: cannot create it or write in it ({reason})") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = _holder(fd)
        os.close(fd)
        raise ConfigError(f"--output-dir {root} is in use by another run ({holder}); give another --output-dir") from None
    previous = root / "run.json"
    notice = None
    if previous.exists() and not resuming:
        if not overwrite:
            os.close(fd)
            raise ConfigError(f"--output-dir {root} holds a finished run ({_summary(previous)}); resume it with "
                              "--load, or give --overwrite-output-dir or another --output-dir")
        for name in ARTIFACTS:
            with contextlib.suppress(FileNotFoundError):
                (root / name).unlink()
    elif previous.exists():
        notice = f"--load: appending to the artifacts of the run in {root} ({_summary(previous)})"
    os.ftruncate(fd, 0)
    os.pwrite(fd, json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}).encode(), 0)
    return RunDirLock(fd, root / LOCK_FILE), notice


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0) or b"{}")
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(info["started"])))
        return f"pid {info['pid']} on {info['host']}, started {started}"
    except (ValueError, KeyError, TypeError, OSError):
        return "its lock file names no pid"


def _summary(run_json: Path) -> str:
    try:
        info = json.loads(run_json.read_text())
    except (OSError, ValueError):
        return "run.json unreadable"
    return f"status {info.get('status', '?')}"
