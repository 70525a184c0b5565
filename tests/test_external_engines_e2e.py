"""``--rollout-external``: a run drives engine servers it did not start, over SGLang's HTTP API only.

The servers are ``relax serve-engine`` processes this test starts (the embedded engine; a real SGLang
server speaks the same protocol). Weights reach both by /update_weights_from_distributed (gloo).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from relax.backends.embedded.launch import EngineProcess
from tests.e2e_helpers import FAST_FLAGS, _ray_dir, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]


@pytest.fixture
def two_engines():
    procs = [EngineProcess.start(["--hf-checkpoint", "tiny-qwen3"]) for _ in range(2)]
    yield procs
    for p in procs:
        p.stop()


def _external(procs: list[EngineProcess]) -> list[str]:
    return ["--rollout-external", "--rollout-external-engine-addrs", *(p.url for p in procs)]


def _by_version(run: Path) -> dict[int, dict[str, dict]]:
    out: dict[int, dict[str, dict]] = {}
    for r in read_jsonl(run / "weights.jsonl"):
        out.setdefault(r["version"], {})[r["side"]] = r["checksums"]
    return out


def test_trains_three_steps_against_two_served_engines_with_equal_weights(tmp_path, two_engines) -> None:
    out = tmp_path / "run"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "3", *_external(two_engines), "--output-dir", str(out)],
                        tmp_path))
    versions = _by_version(out)
    assert sorted(versions) == [0, 1, 2, 3]
    for version, sides in versions.items():
        assert set(sides) == {"trainer", "engine:0", "engine:1"}, version
        assert sides["trainer"] == sides["engine:0"] == sides["engine:1"], f"version {version}"
    events = read_jsonl(out / "events.jsonl")
    urls = {e["role"]: e["url"] for e in events if e["event"] == "process_started" and e["role"].startswith("engine")}
    assert urls == {"engine:0": two_engines[0].url, "engine:1": two_engines[1].url}
    assert {tuple(e["transports"]) for e in events if e["event"] == "weights_synced"} == {("distributed",)}
    trained = [f for f in read_jsonl(out / "samples.jsonl") if f["fate"] == "trained"]
    assert len(trained) == 3 * 32


def test_an_unreachable_engine_fails_the_start_with_one_line(tmp_path, two_engines) -> None:
    dead = "127.0.0.1:9"  # the discard port: nothing serves HTTP there
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--rollout-external", "--rollout-external-engine-addrs",
                      two_engines[0].url, dead, "--output-dir", str(tmp_path / "run")], tmp_path, timeout=120)
    assert proc.returncode == 2
    assert f"relax: --rollout-external-engine-addrs {dead}: engine unreachable" in proc.stderr


def _start(tmp_path: Path, *flags: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", RELAX_RAY_TEMP_DIR=str(_ray_dir(tmp_path)))
    return subprocess.Popen([sys.executable, "-m", "relax.cli", "train", *FAST_FLAGS, *flags,
                             "--output-dir", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def _wait_for_step(run: Path, step: int, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    path = run / "events.jsonl"
    while time.monotonic() < deadline:
        if path.exists() and any(json.loads(line).get("event") == "step_end" and json.loads(line)["step"] >= step
                                 for line in path.read_text().splitlines() if line.strip()):
            return
        time.sleep(0.05)
    raise AssertionError(f"run never reached step {step}")


@pytest.mark.parametrize("fault_tolerance", [False, True])
def test_killing_one_engine_mid_run(tmp_path, two_engines, fault_tolerance) -> None:
    """Without fault tolerance: one line naming the engine. With it: a restart-free retry on the other
    engine (the router resends in-flight requests there; the dead one leaves the run), nothing lost."""
    steps = 12
    flags = ["--use-fault-tolerance", "--rollout-health-check-interval", "1", "--rollout-health-check-timeout",
             "3"] if fault_tolerance else []
    proc = _start(tmp_path, "--num-rollout", str(steps), *_external(two_engines), *flags)
    run = tmp_path / "run"
    _wait_for_step(run, 2)
    os.kill(two_engines[1].proc.pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    if not fault_tolerance:
        assert proc.returncode != 0
        assert f"engine:1 ({two_engines[1].url}) failed" in err and "--use-fault-tolerance" in err, err[-2000:]
        return
    assert proc.returncode == 0, err[-3000:]
    events = read_jsonl(run / "events.jsonl")
    assert any(e["event"] == "engine_dropped" and e["role"] == "engine:1" for e in events)
    assert not any(e["event"] == "restart" for e in events)
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(steps))
    for version, sides in _by_version(run).items():
        assert "engine:0" in sides and all(s == sides["trainer"] for s in sides.values()), f"version {version}"
    trained = sorted(f["index"] for f in read_jsonl(run / "samples.jsonl") if f["fate"] == "trained")
    assert trained == list(range(steps * 32))
