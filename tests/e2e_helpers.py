"""Helpers for tests that run ``relax train`` as a real subprocess, or Ray in-process.

A subprocess run joins one Ray cluster per test process (an xdist worker), started on its first use and
stopped when the process exits: starting a private cluster costs a run ~6 s of a 2-core CI machine, and a
job's actors and placement groups go with its driver, so runs do not see each other's. A test about the
cluster itself (a private cluster's files, its processes, a run killed from outside) passes
``private_cluster=True`` and gets the private cluster that ``relax train`` starts by default.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.ray_cluster import ENV as CLUSTER_ENV
from tests.ray_cluster import LocalCluster

# A small, fast variant of the quickstart: 8 prompts x 4 samples, two micro-batches per step.
FAST_FLAGS = [
    "--preset", "quickstart",
    "--rollout-batch-size", "8",
    "--n-samples-per-prompt", "4",
    "--global-batch-size", "32",
    "--micro-batch-size", "16",
]


def run_relax(args: list[str], tmp_path: Path, timeout: float = 600, env: dict[str, str] | None = None,
              private_cluster: bool = False) -> subprocess.CompletedProcess[str]:
    if private_cluster or "RAY_ADDRESS" in (env or {}):
        base = dict(os.environ, RELAX_RAY_TEMP_DIR=str(_ray_dir(tmp_path)))
    else:
        base = {k: v for k, v in os.environ.items() if k != "RELAX_RAY_TEMP_DIR" and not k.startswith("RAY_")}
        base.update(CLUSTER_ENV, RAY_ADDRESS=shared_cluster_address())
    env = dict(base, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", **(env or {}))
    return subprocess.run(
        [sys.executable, "-m", "relax.cli", "train", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path,
    )


_SHARED: list = []  # the test process's LocalCluster, once started


def shared_cluster_address() -> str:
    """The test process's own Ray cluster: 2 CPUs and no GPU on the CI machine, as a private one there; every
    visible GPU and every core where there are GPUs (a GPU test run needs what ``relax train``'s own cluster
    would detect)."""
    if not _SHARED:
        import torch

        gpus = torch.cuda.device_count()
        _SHARED.append(LocalCluster(nodes=1, gpus=gpus, cpus=(os.cpu_count() or 2) if gpus else 2).start())
        atexit.register(_SHARED[0].stop)
    return _SHARED[0].address


def _ray_dir(tmp_path: Path) -> Path:
    # Ray's socket paths must stay short (AF_UNIX limit), so use a short dir under /tmp.
    d = Path("/tmp") / f"rt{abs(hash(str(tmp_path))) % 10**8}"
    d.mkdir(exist_ok=True)
    return d


def in_process_ray(tmp_dir: Path) -> Iterator[None]:
    """A one-CPU local Ray cluster in this test process, shut down afterwards (a module fixture's body)."""
    import ray

    from relax.distributed.cluster import worker_env

    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level=logging.WARNING,
             _temp_dir=str(_ray_dir(tmp_dir)), runtime_env={"env_vars": worker_env()})
    yield
    ray.shutdown()


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def assert_ok(proc: subprocess.CompletedProcess[str]) -> None:
    assert proc.returncode == 0, f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"


def pretend_gpu_machine(monkeypatch) -> None:
    """Flag parsing as on the GPU machine: ``--train-backend megatron`` checks for CUDA and megatron-core, which
    the CPU CI machine lacks (the dev venv may have megatron-core; CI does not)."""
    from relax.backends.megatron import checks

    real = checks.module_available
    monkeypatch.setattr(checks, "_cuda_available", lambda: True)
    monkeypatch.setattr(checks, "module_available", lambda name: name == "megatron.core" or real(name))
