"""Quiet, bounded ends (issue 40): an engine that never answers one endpoint ends the run within that wait's bound,
in one last stderr line naming the engine and the endpoint.

A fake engine, an HTTP proxy in front of a real ``relax serve-engine`` process, forwards everything except one
endpoint, on which it holds the connection open and never answers. Each case is one ``relax train`` of the CPU
quickstart (``--rollout-external``, one step) against it, on the test process's shared Ray cluster (a private
cluster per run would cost ~15 s more each). The endpoints are every one a passing run of this shape calls
(counted through the same proxy): /server_info (attach), /init_weights_update_group,
/update_weights_from_distributed and /weights_checker (the first sync), /generate (the rollout),
/release_memory_occupation and /resume_memory_occupation (quickstart's --offload-rollout) and /health (the run's
router, whose background checks no run waits on, and, with --use-fault-tolerance, the supervisor's, which end
the run once the only engine is dropped). docs/waits.md lists every wait of a run, these included.

=================================  ==========================================  ==========  ==============
endpoint                           bound (flag or constant)                    here        time to fail
=================================  ==========================================  ==========  ==============
/server_info                       ATTACH_TIMEOUT_S (engine_launchers.py)      10 s        10.8 s
/init_weights_update_group         --weight-sync-timeout (default 60)          3 s         3.5 s
/update_weights_from_distributed   --weight-sync-timeout                       3 s         3.4 s
/weights_checker                   --weight-sync-timeout                       3 s         3.6 s
/generate                          --slime-router-timeout (unset: 600)         3 s         3.3 s
/release_memory_occupation         --weight-sync-timeout                       3 s         3.4 s
/resume_memory_occupation          --weight-sync-timeout                       3 s         3.3 s
/health (--use-fault-tolerance)    --rollout-health-check-timeout              2 s         2.3 s
=================================  ==========================================  ==========  ==============

"time to fail": from the proxy's first held request to the run's exit, measured on a 2-core CPU machine. It is the
bound plus the last few seconds of the run: ERROR_GRACE_S (2 s, the other members' errors of a weight broadcast),
the health-check interval, Ray's shutdown.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from harness.faults.proxy import FaultProxy
from relax.backends.embedded.launch import EngineProcess
from tests.e2e_helpers import FAST_FLAGS, run_relax

pytestmark = [pytest.mark.ray]

SLACK_S = 25.0  # the run's own last seconds on a loaded CI machine; bound + slack stays within the 60 s


class HangingProxy(FaultProxy):
    """Forwards every request except those to ``path``, which it holds open without an answer."""

    def __init__(self, target: str, path: str):
        super().__init__(target)
        self.path = path
        self.held_at: float | None = None  # monotonic time of the first held request

    async def _handle(self, request):
        if request.path != self.path:
            return await self._forward(request)
        if self.held_at is None:
            self.held_at = time.monotonic()
        await asyncio.Event().wait()  # never answers; cancelled when the client goes away or the proxy stops


@dataclass(frozen=True)
class Case:
    path: str
    bound_s: float  # the wait's bound as this test sets it
    flags: tuple[str, ...] = ()

    def __str__(self) -> str:
        return self.path.strip("/") + ("-ft" if "--use-fault-tolerance" in self.flags else "")


NO_TRAINER = ("--debug-rollout-only",)  # a wait before any sync: no trainer to start (~10 s less)
# --num-rollout: far more steps than the run has time for, so only the supervisor's verdict ends it (30 once finished
# first on a loaded CI machine, before the supervisor's held probe ran out)
FT = ("--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "2",
      "--num-rollout", "1000")
CASES = [
    Case("/server_info", 10.0, NO_TRAINER),
    Case("/init_weights_update_group", 3.0),
    Case("/update_weights_from_distributed", 3.0),
    Case("/weights_checker", 3.0),
    Case("/generate", 3.0, NO_TRAINER),
    Case("/release_memory_occupation", 3.0),
    Case("/resume_memory_occupation", 3.0),
    Case("/health", 2.0 + 1.0, FT),  # the health check's timeout after one interval
]


@pytest.fixture(scope="module")
def engine():
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3"])
    yield proc
    proc.stop()


def _train(tmp_path: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    return run_relax([*FAST_FLAGS, "--num-rollout", "1", "--weight-sync-timeout", "3", "--slime-router-timeout", "3",
                      *flags, "--output-dir", str(tmp_path / "run")], tmp_path, timeout=240)


@pytest.mark.parametrize("case", CASES, ids=str)
def test_an_engine_that_never_answers_ends_the_run_within_the_bound(case: Case, engine, tmp_path) -> None:
    proxy = HangingProxy(engine.url, case.path).start()
    try:
        proc = _train(tmp_path, "--rollout-external", "--rollout-external-engine-addrs", proxy.address,
                      *case.flags)
        ended = time.monotonic()
    finally:
        proxy.stop()
    assert proxy.held_at is not None, f"the run never called {case.path}"
    took = ended - proxy.held_at
    last = (proc.stderr.strip().splitlines() or [f"<no stderr; exit {proc.returncode}>"])[-1]
    print(f"{case}: exit {proc.returncode} {took:.1f} s after the hang: {last}")
    assert proc.returncode != 0, proc.stderr[-3000:]
    assert took <= case.bound_s + SLACK_S, f"{took:.1f} s after the hang (bound {case.bound_s} s): {last}"
    assert last.startswith("relax: ") and f"http://{proxy.address}" in last and case.path in last, last
