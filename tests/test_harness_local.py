"""The local executor against a fake engine: real processes, real signals, verified cleanup."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import psutil
import pytest

from harness.artifacts import RunArtifacts
from harness.executors.local import LocalExecutor
from harness.runner import HarnessConfig, run_scenario
from harness.spec import ScenarioSpec

FAKE = [sys.executable, "-m", "harness.fake_engine"]


def cfg(tmp_path: Path, grace_s: float = 2.0) -> HarnessConfig:
    return HarnessConfig(executor=LocalExecutor(engine_cmd=FAKE, grace_s=grace_s), results_dir=tmp_path / "res",
                         baselines_dir=tmp_path / "baselines", machine_class="cpu: Test CPU x2")


def spec(**kw) -> ScenarioSpec:
    return ScenarioSpec.model_validate({"name": "fake", **kw})


def all_pids(result) -> set[int]:
    pids = set(result.runs[0].details.get("tracked_pids", []))
    for ev in RunArtifacts.load(result.runs[0].output_dir).events_named("process_started"):
        pids.add(int(ev["pid"]))
    return pids


def assert_all_gone(pids: set[int]) -> None:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        alive = [p for p in pids if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
        if not alive:
            return
        time.sleep(0.1)
    pytest.fail(f"processes survived cleanup: {alive}")


def test_healthy_run_passes_checks_and_leaves_nothing(tmp_path: Path) -> None:
    res = run_scenario(spec(engine_flags=["--num-rollout", "3", "--engines", "2"],
                            checks=[{"kind": "weight_equality", "engines": 2}, {"kind": "sample_accounting"}]),
                       cfg(tmp_path))
    assert res.passed, res.summary()
    run = res.run()
    assert run.exit_code == 0 and not run.timed_out
    assert (Path(run.output_dir) / "metrics.jsonl").exists()
    assert "RELAX_RAY_TEMP_DIR" not in run.log_tail
    assert not Path(run.details["ray_temp_dir"]).exists()  # its own Ray temp dir, removed after
    assert_all_gone(all_pids(res))


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    # hangs forever, ignores SIGTERM, has children: SIGTERM then SIGKILL to the group
    t0 = time.monotonic()
    res = run_scenario(spec(engine_flags=["--fake-hang", "--fake-ignore-term", "--engines", "2"], timeout_s=3),
                       cfg(tmp_path, grace_s=1.0))
    assert time.monotonic() - t0 < 20
    run = res.run()
    assert run.timed_out and run.exit_code == -9  # SIGTERM was ignored: SIGKILL did it
    assert not res.passed and "timed out after 3s (process group killed)" in res.message
    pids = all_pids(res)
    assert len(pids) >= 4  # driver, trainer, 2 engines
    assert_all_gone(pids)


def test_escaped_and_orphaned_processes_are_cleaned_up_by_pid(tmp_path: Path) -> None:
    res = run_scenario(spec(engine_flags=["--num-rollout", "2", "--fake-step-s", "0.6", "--fake-escape",
                                          "--fake-leave-children"]), cfg(tmp_path))
    run = res.run()
    assert run.exit_code == 0
    escaped = [e["pid"] for e in RunArtifacts.load(run.output_dir).events_named("process_started")
               if e["role"] == "escaped"]
    assert escaped and escaped[0] in run.killed_pids  # outside the group, killed by remembered pid
    assert_all_gone(all_pids(res))


def test_sigkill_fault_fires_at_configured_step_and_is_recorded(tmp_path: Path) -> None:
    res = run_scenario(spec(
        engine_flags=["--num-rollout", "5", "--fake-step-s", "0.3", "--fake-recover"],
        faults=[{"kind": "kill", "target_role": "engine:0", "at": {"step": 2, "phase": "train"}}],
        checks=[{"kind": "fault_outcome", "expect": "recovered", "max_restarts": 1, "min_restarts": 1},
                {"kind": "weight_equality"}, {"kind": "sample_accounting"}]), cfg(tmp_path))
    assert res.passed, res.summary()
    events = RunArtifacts.load(res.run().output_dir).events
    names = [e["event"] for e in events]
    kill = events[names.index("fault_injected")]
    assert kill["role"] == "engine:0" and kill["signal"] == "SIGKILL" and kill["step"] == 2
    first_engine = next(e["pid"] for e in events if e.get("role") == "engine:0")
    assert kill["pid"] == first_engine
    # fired after the step-2 train phase began and before step 3 started
    train2 = next(i for i, e in enumerate(events) if e.get("phase") == "train" and e.get("step") == 2)
    step3 = next(i for i, e in enumerate(events) if e["event"] == "step_start" and e["step"] == 3)
    assert train2 < names.index("fault_injected") < step3
    assert "fault_detected" in names and "restart" in names
    assert_all_gone(all_pids(res))


def test_kill_without_recovery_is_a_fault_not_survived(tmp_path: Path) -> None:
    res = run_scenario(spec(
        engine_flags=["--num-rollout", "5", "--fake-step-s", "0.3"],
        runs=[{"name": "main", "expect_exit": None}],
        faults=[{"kind": "kill", "target_role": "engine:*", "at": {"step": 1}}],
        checks=[{"kind": "fault_outcome", "expect": "recovered"}]), cfg(tmp_path))
    assert not res.passed
    assert res.check("fault_outcome").message.startswith("fault not survived")


def test_unreached_trigger_is_reported(tmp_path: Path) -> None:
    res = run_scenario(spec(engine_flags=["--num-rollout", "2"],
                            faults=[{"kind": "kill", "target_role": "engine:0", "at": {"step": 50}}]), cfg(tmp_path))
    assert not res.passed and "fault never fired: kill on engine:0 at step 50" in res.message


def test_unknown_role_is_reported(tmp_path: Path) -> None:
    res = run_scenario(spec(engine_flags=["--num-rollout", "3", "--fake-step-s", "0.3"],
                            faults=[{"kind": "kill", "target_role": "critic:0", "at": {"step": 1}}]), cfg(tmp_path))
    assert not res.passed and "no process for role 'critic:0'" in res.message


def test_hang_fault_stops_then_continues(tmp_path: Path) -> None:
    res = run_scenario(spec(
        engine_flags=["--num-rollout", "4", "--fake-step-s", "0.3"],
        faults=[{"kind": "hang", "target_role": "trainer:0", "at": {"step": 1}, "duration_s": 0.5}]), cfg(tmp_path))
    assert res.passed, res.summary()
    recs = [(f["event"], f.get("signal")) for f in res.run().faults]
    assert recs == [("fault_injected", "SIGSTOP"), ("fault_cleared", "SIGCONT")]


def test_engine_hook_fault_sets_env_and_fails_fast(tmp_path: Path) -> None:
    res = run_scenario(spec(
        engine_flags=["--num-rollout", "5"], runs=[{"name": "main", "expect_exit": None}],
        faults=[{"kind": "engine_hook", "hook": "reward_raise", "at_step": 2}],
        checks=[{"kind": "fault_outcome", "expect": "failed_fast", "message": "reward function raised",
                 "within_s": 30}]), cfg(tmp_path))
    assert res.passed, res.summary()
    assert res.run().faults[0]["env"] == {"RELAX_FAULT_REWARD_RAISE_AT_STEP": "2"}
    assert res.run().exit_code == 1


def test_not_supported_yet_is_its_own_status(tmp_path: Path) -> None:
    res = run_scenario(spec(engine_flags=["--fake-unsupported=--fully-async"],
                            checks=[{"kind": "weight_equality"}]), cfg(tmp_path))
    assert res.status == "unsupported" and res.message == "engine: not supported yet: --fully-async"
    with pytest.raises(AssertionError, match="not supported yet: --fully-async"):
        res.assert_ok()


def test_unexpected_exit_code_fails_with_the_engine_line(tmp_path: Path) -> None:
    res = run_scenario(spec(engine_flags=["--num-rollout", "1", "--fake-fail", "boom"]), cfg(tmp_path))
    assert not res.passed and res.message == "run main exited 1 (expected 0): relax: run failed: boom"


def test_phases_share_the_output_dir_and_placeholders(tmp_path: Path) -> None:
    res = run_scenario(spec(
        runs=[{"name": "straight", "flags": ["--num-rollout", "4"]},
              {"name": "resumed", "phases": [["--num-rollout", "2"],
                                             ["--num-rollout", "4", "--load", "{output_dir}/ckpt"]]}],
        checks=[{"kind": "loss_parity", "runs": ["straight", "resumed"], "min_steps": 4}]), cfg(tmp_path))
    assert res.passed, res.summary()
    resumed = res.run("resumed")
    assert resumed.launches == 2
    assert f"--load {resumed.output_dir}/ckpt" in Path(resumed.log_path).read_text()
