"""Faults injected from outside the run (signals to real processes), survived or failed fast."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, _ray_dir, read_jsonl

pytestmark = [pytest.mark.ray]


def _start(tmp_path: Path, *flags: str) -> subprocess.Popen:
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", RELAX_RAY_TEMP_DIR=str(_ray_dir(tmp_path)))
    return subprocess.Popen([sys.executable, "-m", "relax.cli", "train", *FAST_FLAGS, *flags,
                             "--output-dir", str(tmp_path / "run")],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=tmp_path)


def _events(tmp_path: Path) -> list[dict]:
    path = tmp_path / "run" / "events.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _wait_for_step_then_pid(tmp_path: Path, role: str, step: int, timeout: float = 180) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        events = _events(tmp_path)
        if any(e["event"] == "step_end" and e["step"] >= step for e in events):
            return [e for e in events if e["event"] == "process_started" and e["role"] == role][-1]["pid"]
        time.sleep(0.05)
    raise AssertionError(f"run never reached step {step}")


def _finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str]:
    _, err = proc.communicate(timeout=timeout)
    return proc.returncode, err


def _assert_equal_weights_every_version(run: Path) -> None:
    """Every record of a version (trainer and every engine, restarts included) has the same checksums."""
    by_version: dict[int, list[dict]] = {}
    for r in read_jsonl(run / "weights.jsonl"):
        by_version.setdefault(r["version"], []).append(r)
    for version, records in by_version.items():
        sides = {r["side"] for r in records}
        assert "trainer" in sides and any(s.startswith("engine:") for s in sides), f"version {version}: {sides}"
        assert all(r["checksums"] == records[0]["checksums"] for r in records), f"version {version} differs"


def test_engine_sigkill_is_restarted_resynced_and_loses_nothing(tmp_path: Path) -> None:
    steps = 25
    proc = _start(tmp_path, "--num-rollout", str(steps), "--use-fault-tolerance",
                  "--rollout-health-check-interval", "1", "--rollout-health-check-timeout", "5")
    pid = _wait_for_step_then_pid(tmp_path, "engine:0", 3)
    os.kill(pid, signal.SIGKILL)
    code, err = _finish(proc)
    assert code == 0, err[-3000:]
    run = tmp_path / "run"
    events = _events(tmp_path)
    assert any(e["event"] == "fault_detected" and e["role"] == "engine:0" for e in events)
    assert any(e["event"] == "restart" and e["role"] == "engine:0" for e in events)
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == list(range(steps))
    _assert_equal_weights_every_version(run)
    trained = sorted(f["index"] for f in read_jsonl(run / "samples.jsonl") if f["fate"] == "trained")
    assert trained == list(range(steps * 32))


def test_engine_sigstop_hang_is_detected_by_health_checks(tmp_path: Path) -> None:
    steps = 25
    proc = _start(tmp_path, "--num-rollout", str(steps), "--use-fault-tolerance",
                  "--rollout-health-check-interval", "0.5", "--rollout-health-check-timeout", "2")
    pid = _wait_for_step_then_pid(tmp_path, "engine:0", 3)
    os.kill(pid, signal.SIGSTOP)
    try:
        code, err = _finish(proc)
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert code == 0, err[-3000:]
    assert any(e["event"] == "restart" and e["role"] == "engine:0" for e in _events(tmp_path))
    assert len(read_jsonl(tmp_path / "run" / "metrics.jsonl")) == steps


def test_engine_death_without_fault_tolerance_fails_fast_with_a_clear_error(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--num-rollout", "200")
    pid = _wait_for_step_then_pid(tmp_path, "engine:0", 2)
    os.kill(pid, signal.SIGKILL)
    code, err = _finish(proc, timeout=120)
    assert code != 0
    assert "EngineDiedError: engine:0 (http://127.0.0.1:" in err and "--use-fault-tolerance" in err, err[-2000:]


def test_trainer_sigkill_triggers_global_restart_from_checkpoint(tmp_path: Path) -> None:
    steps = 20
    proc = _start(tmp_path, "--num-rollout", str(steps), "--use-health-check", "--save", str(tmp_path / "ckpt"),
                  "--save-interval", "2", "--rollout-health-check-interval", "1")
    pid = _wait_for_step_then_pid(tmp_path, "trainer:0", 5)
    os.kill(pid, signal.SIGKILL)
    code, err = _finish(proc)
    assert code == 0, err[-3000:]
    events = _events(tmp_path)
    restarts = [e for e in events if e["event"] == "restart" and e["role"] == "global"]
    assert len(restarts) == 1 and restarts[0]["load"] == str(tmp_path / "ckpt")
    resumes = [e for e in events if e["event"] == "resume"]
    assert resumes and resumes[-1]["step"] >= 2
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert metrics[-1]["step"] == steps - 1
    assert {m["step"] for m in metrics} == set(range(steps))
    _assert_equal_weights_every_version(tmp_path / "run")


def test_exceeding_max_global_restart_exits_with_a_clear_message(tmp_path: Path) -> None:
    proc = _start(tmp_path, "--num-rollout", "200", "--use-health-check", "--max-global-restart", "0")
    pid = _wait_for_step_then_pid(tmp_path, "trainer:0", 2)
    os.kill(pid, signal.SIGKILL)
    code, err = _finish(proc, timeout=120)
    assert code == 1
    last = [line for line in err.splitlines() if line.startswith("relax: ")][-1]
    assert "more than --max-global-restart 0 allows" in last, err[-2000:]
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and "--max-global-restart" in info["error"]
