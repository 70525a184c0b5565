"""Helpers for tests that run ``relax train`` as a real subprocess, or Ray in-process.

A subprocess run joins one Ray cluster per test process (an xdist worker), started on its first use and
stopped when the process exits: starting a private cluster costs a run ~6 s of a 2-core CI machine, and a
job's actors and placement groups go with its driver, so runs do not see each other's. A test about the
cluster itself (a private cluster's files, its processes, a run killed from outside) passes
``private_cluster=True`` and gets the private cluster that ``relax train`` starts by default. Runs on the shared
cluster are forked from a warm driver that has imported torch, transformers and Ray once (tests/driver_forks.py),
and on a machine without GPUs the cluster's Ray workers are forked from a warm parent too
(tests/ray_worker_zygote.py).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from tests.driver_forks import WarmDriver
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
    """``relax train ARGS`` in ``tmp_path``, as `subprocess.run` reports it; on the shared cluster, forked from the
    test process's warm driver where it can be (tests/driver_forks.py)."""
    if private_cluster or "RAY_ADDRESS" in (env or {}):
        env = {**os.environ, "RELAX_RAY_TEMP_DIR": str(_ray_dir(tmp_path)), **RUN_ENV, **(env or {})}
        warm = None
    else:
        env = {**_shared_cluster_env(), **(env or {})}
        warm = warm_driver(env)
    done = warm.run(["train", *args], env, tmp_path, timeout) if warm is not None else None
    _log_start("forked" if done is not None else "fresh")
    if done is not None:
        return done
    return subprocess.run(
        [sys.executable, "-m", "relax.cli", "train", *args],
        capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path,
    )


RUN_ENV = {"OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _log_start(how: str) -> None:
    """``RELAX_TEST_START_LOG=FILE``: one line per run_relax, how its driver started (forked, fresh, server)."""
    log = os.environ.get("RELAX_TEST_START_LOG")
    if log:
        with open(log, "a") as f:
            f.write(f"{os.environ.get('PYTEST_CURRENT_TEST', '?').split(' ')[0]} {how}\n")
_WARM: list[WarmDriver | None] = []  # the test process's warm driver (tests/driver_forks.py), or None if it failed


def _shared_cluster_env() -> dict[str, str]:
    """A run's environment on the shared cluster: this process's, without its own Ray settings."""
    base = {k: v for k, v in os.environ.items() if k != "RELAX_RAY_TEMP_DIR" and not k.startswith("RAY_")}
    return {**base, **CLUSTER_ENV, "RAY_ADDRESS": shared_cluster_address(), **RUN_ENV}


def warm_driver(env: dict[str, str]) -> WarmDriver | None:
    """The test process's warm driver for a run in ``env``: the current one, or a new one in ``env`` when the run's
    environment differs from its own in what modules read at import (an in-process call of relax code may have set
    such a variable for good: ``start_ray`` sets the workers' ``TRANSFORMERS_OFFLINE``). None with
    ``RELAX_TEST_FRESH_DRIVERS=1`` (every run a fresh ``python -m relax.cli``) or once a server failed to start."""
    if os.environ.get("RELAX_TEST_FRESH_DRIVERS") == "1" or (_WARM and _WARM[0] is None):
        return None
    if _WARM and _WARM[0].accepts(env):
        return _WARM[0]
    if _WARM:
        _WARM[0].close()
    _log_start("server")
    try:
        _WARM[:] = [WarmDriver(env)]
    except RuntimeError as e:  # every run then starts a fresh driver: slower, the same run
        warnings.warn(f"relax runs start fresh drivers: {e}", stacklevel=2)
        _WARM[:] = [None]
        return None
    atexit.register(_WARM[0].close)
    return _WARM[0]


_SHARED: list = []  # the test process's LocalCluster, once started


def shared_cluster_address() -> str:
    """The test process's own Ray cluster: 2 CPUs and no GPU on the CI machine, as a private one there; every
    visible GPU and every core where there are GPUs (a GPU test run needs what ``relax train``'s own cluster
    would detect)."""
    if not _SHARED:
        import torch

        gpus = torch.cuda.device_count()
        # CPU: workers forked from a warm parent (tests/ray_worker_zygote.py); a GPU machine starts them as Ray does
        _SHARED.append(LocalCluster(nodes=1, gpus=gpus, cpus=(os.cpu_count() or 2) if gpus else 2,
                                    warm_workers=not gpus).start())
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
