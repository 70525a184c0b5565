"""The test cluster's warm worker parent (tests/ray_worker_zygote.py): the workers it forks are Ray workers as the
raylet would have started them, and what it cannot fork starts the ordinary way."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ray_cluster import ENV, LocalCluster
from tests.ray_worker_client import expand
from tests.ray_worker_zygote import env_differences

pytestmark = pytest.mark.ray

ROOT = Path(__file__).resolve().parents[1]

# one job: two actors with a runtime env; each reports its pid, parent, group, job and environment; then one of them is
# killed by its pid
_JOB = """
import json, os, random, ray
ray.init(address=%r, runtime_env={"env_vars": {"RELAX_ZYGOTE_PROBE": "${HOME}/x", "OMP_NUM_THREADS": %r}})
@ray.remote(num_cpus=0)
class Probe:
    def where(self):
        return {"pid": os.getpid(), "ppid": os.getppid(), "pgid": os.getpgid(0), "job": os.environ.get("RAY_JOB_ID"),
                "probe": os.environ.get("RELAX_ZYGOTE_PROBE"), "draw": random.random()}
probes = [Probe.remote() for _ in range(2)]
rows = ray.get([p.where.remote() for p in probes], timeout=60)
victim = rows[0]["pid"]
os.kill(victim, 9)
try:
    ray.get(probes[0].where.remote(), timeout=60)
    died = False
except ray.exceptions.RayActorError:
    died = True
with open(%r, "w") as out:  # a file, not stdout: Ray's log thread writes worker lines into stdout mid-print
    json.dump({"rows": rows, "died": died}, out)
"""


def test_env_differences_ignore_only_what_is_read_at_run_time() -> None:
    own = {"PATH": "/bin", "OMP_NUM_THREADS": "1"}
    assert env_differences({**own, "RAY_JOB_ID": "01000000", "RELAX_FAULT_X": "1", "PYTEST_XDIST_WORKER": "gw0"},
                           own) == []
    assert env_differences({**own, "OMP_NUM_THREADS": "2"}, own) == ["OMP_NUM_THREADS"]
    assert env_differences({"PATH": "/bin"}, own) == ["OMP_NUM_THREADS"]


def test_runtime_env_variables_expand_as_rays_do() -> None:
    env = {"HOME": "/root"}
    assert expand("${HOME}/x:$HOME", env) == "/root/x:/root"
    assert expand("a${UNSET_VAR}b", env) == "ab"


def test_forked_workers_are_rays_workers_and_the_zygote_outlives_jobs() -> None:
    with LocalCluster(nodes=1, gpus=0, cpus=2, warm_workers=True) as cluster:
        (zygote,) = [proc.pid for proc in cluster.zygotes]
        _wait_ready(cluster)
        env = {**os.environ, **ENV}
        jobs = []
        for index, threads in enumerate(("1", "1", "2")):  # a second job: the zygote outlived the first one's workers
            result = cluster.root / f"job{index}.json"
            proc = subprocess.run([sys.executable, "-c", _JOB % (cluster.address, threads, str(result))],
                                  capture_output=True, text=True, env=env, cwd=ROOT, timeout=180)
            assert proc.returncode == 0, proc.stderr[-3000:]
            assert result.exists(), (proc.stdout[-2000:], proc.stderr[-2000:])
            jobs.append(json.loads(result.read_text()))
        # the third job's workers would see another OMP_NUM_THREADS than the zygote's imports did: started as usual
        assert all(r["ppid"] != zygote for r in jobs[2]["rows"]) and jobs[2]["died"]
        assert "refused: OMP_NUM_THREADS='2'/'1'" in (cluster.root / "z0.log").read_text()
        jobs = jobs[:2]
        for job in jobs:
            rows = job["rows"]
            assert all(r["ppid"] == zygote for r in rows), (zygote, rows)  # forked, not started
            assert all(r["pgid"] == r["pid"] for r in rows)  # a group of its own, as the raylet starts workers
            assert all(r["probe"] == f"{os.environ['HOME']}/x" for r in rows)  # the runtime env, expanded
            assert len({r["job"] for r in rows}) == 1 and rows[0]["job"]  # the raylet's job id, per worker
            assert rows[0]["draw"] != rows[1]["draw"]  # random state drawn again in each child
            assert job["died"]  # a forked worker killed by its pid is a dead actor to Ray
        assert jobs[0]["rows"][0]["job"] != jobs[1]["rows"][0]["job"]


def _wait_ready(cluster: LocalCluster, timeout: float = 120) -> None:
    log = cluster.root / "z0.log"
    deadline = time.monotonic() + timeout
    while "ready" not in (log.read_text() if log.exists() else ""):
        assert time.monotonic() < deadline, "the zygote did not finish its imports"
        time.sleep(0.5)
