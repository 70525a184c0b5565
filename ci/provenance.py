"""Where a benchmark figure comes from: the command, the commit and the machine, stored in its JSON.

Every bench script writes ``{"provenance": provenance(), ...}`` so a figure quoted in the docs can be
traced to the run that produced it (docs/results/ holds those JSON files). On the GPU machine the
working tree's ``.git`` is not this checkout's: ``RELAX_COMMIT`` (set by the caller) names the commit there.
The engine's A/B switches (``RELAX_DECODE_*`` environment variables) that were set open the command, as a shell
would take them, so an A/B run's JSON says which side it is.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path

from harness.commit import source_commit

ROOT = Path(__file__).resolve().parents[1]


def commit() -> str:
    """The run's commit (`harness.commit.source_commit`: ``RELAX_COMMIT`` first, then the checkout's HEAD), with
    ``+dirty`` when it is the checkout's and that has uncommitted changes; else unknown."""
    head = source_commit(ROOT)
    if head is None:
        return "unknown"
    if os.environ.get("RELAX_COMMIT"):
        return head
    try:
        dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        dirty = ""
    return head + ("+dirty" if dirty else "")


def machine() -> dict:
    """CPU model and cores, and the GPUs torch sees (name and count), without initialising CUDA needlessly."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = {"host": platform.node(), "cpu": cpu, "cpu_cores": os.cpu_count(), "python": platform.python_version()}
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name(0)
            info["gpu_count"] = torch.cuda.device_count()
            info.update(gpu_state())
    except ImportError:
        pass
    return info


GPU_STATE_FIELDS = ("driver_version", "pstate", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
                    "power.limit", "temperature.gpu")


def gpu_state() -> dict:
    """GPU 0's driver, performance state, clocks, power limit and temperature as ``nvidia-smi`` reports them when the
    JSON is written ({} without ``nvidia-smi``). Why: one decode binary measured 75.6k to 84.7k tok/s on the H100s
    of one day with the same per-kernel durations; these are what could tell two machines apart."""
    try:
        out = subprocess.run(["nvidia-smi", "-i", "0", f"--query-gpu={','.join(GPU_STATE_FIELDS)}",
                              "--format=csv,noheader"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return {}
    values = [v.strip() for v in out.stdout.strip().split(",")]
    if out.returncode != 0 or len(values) != len(GPU_STATE_FIELDS):
        return {}
    return {"gpu_state": dict(zip(GPU_STATE_FIELDS, values, strict=True))}


def switches() -> list[str]:
    """``NAME=value`` for every ``RELAX_DECODE_*`` variable set in this process's environment, sorted."""
    return [f"{name}={value}" for name, value in sorted(os.environ.items()) if name.startswith("RELAX_DECODE_")]


def provenance(argv: list[str] | None = None) -> dict:
    return {"command": shlex.join([*switches(), Path(sys.executable).name, *(sys.argv if argv is None else argv)]),
            "commit": commit(), "machine": machine(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_result(path: str | os.PathLike, **fields) -> None:
    """A bench's JSON at ``path`` (its folder made): ``{"provenance": provenance(), **fields}``."""
    import json

    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"provenance": provenance(), **fields}, indent=1))
