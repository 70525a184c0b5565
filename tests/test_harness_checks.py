"""Every check passes on a healthy synthetic run and FAILS on the defect it exists to catch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import baselines
from harness.artifacts import RunArtifacts
from harness.checks import CHECKS, CheckContext, Status, parse_check
from harness.profiles import Profile
from harness.synthetic import edit_jsonl, make_run


def ctx(tmp_path: Path, **runs: Path) -> CheckContext:
    return CheckContext(runs={k: RunArtifacts.load(v) for k, v in runs.items()}, root=tmp_path,
                        baselines_dir=tmp_path / "baselines", baseline_key="synthetic")


def check(spec: dict, context: CheckContext):
    return parse_check(spec).run_check(context)


@pytest.fixture
def good(tmp_path: Path) -> Path:
    return make_run(tmp_path / "good")


def test_registry_lists_every_check() -> None:
    assert {"loss_parity", "weight_equality", "logprob_mismatch", "sample_accounting", "throughput",
            "fault_outcome", "learning", "metric_bound"} <= set(CHECKS.names())
    with pytest.raises(ValueError, match="unknown check .nope.; known:"):
        parse_check({"kind": "nope"})


# -- weight-update equality -----------------------------------------------------------------------
def test_weights_equal_passes(tmp_path: Path, good: Path) -> None:
    res = check({"kind": "weight_equality", "engines": 2}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


def test_weights_corrupted_checksum_after_sync_fails(tmp_path: Path, good: Path) -> None:
    def corrupt(recs):
        for r in recs:
            if r["version"] == 3 and r["side"] == "engine:1":
                r["checksums"]["model.layers.0.mlp.up_proj.weight"] = "deadbeef0000"
        return recs

    edit_jsonl(good / "weights.jsonl", corrupt)
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert "version 3" in res.message and "engine:1" in res.message
    assert "model.layers.0.mlp.up_proj.weight" in res.message and "deadbeef" in res.message


def test_weights_missing_engine_record_fails(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "weights.jsonl", lambda rs: [r for r in rs if not (r["version"] == 2 and r["side"] == "engine:0")])
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message.startswith("version 2: missing engine record(s) engine:0"), res.message


def test_weights_version_without_any_engine_fails(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "weights.jsonl", lambda rs: [r for r in rs if not (r["version"] == 4 and r["side"] != "trainer")])
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "version 4: no engine record" in res.message


def test_weights_missing_tensor_and_missing_trainer_fail(tmp_path: Path, good: Path) -> None:
    def drop(recs):
        for r in recs:
            if r["version"] == 1 and r["side"] == "engine:0":
                del r["checksums"]["lm_head.weight"]
        return [r for r in recs if not (r["version"] == 5 and r["side"] == "trainer")]

    edit_jsonl(good / "weights.jsonl", drop)
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=good))
    problems = res.details["problems"]
    assert any("version 1: engine:0 lacks tensor 'lm_head.weight'" in p for p in problems)
    assert any(p.startswith("version 5:") and "no trainer record" in p for p in problems)


def test_weights_empty_file_fails(tmp_path: Path, good: Path) -> None:
    (good / "weights.jsonl").write_text("")
    assert check({"kind": "weight_equality"}, ctx(tmp_path, main=good)).status is Status.FAILED


# -- loss parity ----------------------------------------------------------------------------------
def test_parity_identical_runs_pass(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, ctx(tmp_path, a=a, b=b))
    assert res.status is Status.PASSED, res.message
    assert "atol 1e-06" in res.message  # the CPU profile default


def test_parity_diverging_loss_fails_naming_step_and_key(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")

    def diverge(recs):
        for r in recs:
            if r["step"] >= 3:
                r["train/loss"] += 1e-4
        return recs

    edit_jsonl(b / "metrics.jsonl", diverge)
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, ctx(tmp_path, a=a, b=b))
    assert res.status is Status.FAILED
    assert res.message.startswith("step 3: train/loss diverges"), res.message
    # within an explicitly stated looser tolerance it passes
    loose = check({"kind": "loss_parity", "runs": ["a", "b"], "atol": 1e-3}, ctx(tmp_path, a=a, b=b))
    assert loose.status is Status.PASSED


def test_parity_missing_step_and_gpu_profile_tolerance(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", loss_offset=5e-3)
    edit_jsonl(b / "metrics.jsonl", lambda rs: rs[:-1])
    context = ctx(tmp_path, a=a, b=b)
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, context)
    assert "step 5: train/loss missing in b" in res.details["problems"]
    context.profile = Profile.GPU  # bf16: stated rtol 2e-2 / atol 1e-2
    res = check({"kind": "loss_parity", "runs": ["a", "b"], "to_step": 4}, context)
    assert res.status is Status.PASSED, res.message


def test_parity_against_golden_trajectory(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a")
    golden = tmp_path / "golden.json"
    steps = [{k: v for k, v in r.items() if k.startswith(("step", "train/", "rollout/"))}
             for r in RunArtifacts.load(a).metrics]
    golden.write_text(json.dumps({"steps": steps}))
    assert check({"kind": "loss_parity", "golden": "golden.json"}, ctx(tmp_path, a=a)).status is Status.PASSED
    steps[2]["train/grad_norm"] *= 1.01
    golden.write_text(json.dumps({"steps": steps}))
    res = check({"kind": "loss_parity", "golden": str(golden)}, ctx(tmp_path, a=a))
    assert res.status is Status.FAILED and "step 2: train/grad_norm diverges" in res.message


# -- train/rollout mismatch -----------------------------------------------------------------------
def test_mismatch_passes_and_fails_on_step0_kl(tmp_path: Path, good: Path) -> None:
    assert check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good)).status is Status.PASSED
    edit_jsonl(good / "metrics.jsonl", lambda rs: [{**r, "train/ppo_kl": 3e-6} if r["step"] == 0 else r for r in rs])
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and res.message.startswith("step 0: train/ppo_kl=3e-06 not < 1e-08")


def test_mismatch_logprob_gap_over_threshold_fails(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "metrics.jsonl",
               lambda rs: [{**r, "train/train_rollout_logprob_abs_diff": 5e-4} if r["step"] == 4 else r for r in rs])
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "step 4: train/train_rollout_logprob_abs_diff=0.0005 > 0.0001" in res.message


# -- sample accounting ----------------------------------------------------------------------------
def test_accounting_passes(tmp_path: Path, good: Path) -> None:
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


def test_accounting_lost_sample_fails(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "samples.jsonl", lambda rs: [r for r in rs if not (r["step"] == 2 and r["group_index"] == 9
                                                                         and r["index"] == 19)])
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message.startswith("step 2: 7 of 8 samples have a fate, 1 lost; short groups: group 9 (1/2)")


def test_accounting_recycled_never_returned_and_dropped_without_reason(tmp_path: Path, good: Path) -> None:
    def plant(recs):
        recs[0]["fate"] = "recycled"  # step 0, never seen again
        recs[5]["fate"] = "dropped"  # no reason given
        return recs

    edit_jsonl(good / "samples.jsonl", plant)
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    problems = " | ".join(res.details["problems"])
    assert "group 0 index 0 lost: recycled at step 0 and never seen again" in problems
    assert "dropped without a reason" in problems


def test_accounting_recycled_then_trained_passes(tmp_path: Path, good: Path) -> None:
    def recycle(recs):
        first = dict(recs[0], fate="recycled")
        later = dict(recs[0], step=1, attempts=2)
        return [first, *recs[1:], later]

    edit_jsonl(good / "samples.jsonl", recycle)
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


def test_accounting_trained_twice_fails_unless_rolled_back(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "samples.jsonl", lambda recs: [*recs, dict(recs[0], step=1)])
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "has 2 final fates" in res.message

    def rolled_back(recs):
        once = [r for r in recs if r["fate"] == "trained"][:-1]  # undo the planted duplicate
        rollback = dict(once[0], fate="recycled", reason="global_restart: rolled back to step 0")
        return [*once, rollback, dict(once[0], attempts=2)]

    edit_jsonl(good / "samples.jsonl", rolled_back)
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


# -- throughput -----------------------------------------------------------------------------------
def test_throughput_regression_fails_and_calibration_normalizes(tmp_path: Path) -> None:
    base_run = make_run(tmp_path / "base", tokens_per_s=1000.0, step_time_s=0.5)
    context = ctx(tmp_path, main=base_run)
    context.calibration_s = 0.02
    first = check({"kind": "throughput"}, context)
    assert first.status is Status.SKIPPED and "relax-harness baseline update" in first.message
    baselines.update(tmp_path / "baselines", "synthetic", "cpu", "cpu", 0.02, first.measurements)
    assert check({"kind": "throughput"}, context).status is Status.PASSED

    slow = make_run(tmp_path / "slow", tokens_per_s=500.0, step_time_s=1.0)  # same machine, half the speed
    context = ctx(tmp_path, main=slow)
    context.calibration_s = 0.02
    res = check({"kind": "throughput"}, context)
    assert res.status is Status.FAILED
    assert "perf/tokens_per_s" in res.message and "REGRESSION" in res.message and "-50.0%" in res.message

    context.calibration_s = 0.04  # ... but on a machine twice as slow that is no regression
    assert check({"kind": "throughput"}, context).status is Status.PASSED


def test_throughput_gpu_is_per_device_class(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", tokens_per_s=40000.0)
    context = ctx(tmp_path, main=run)
    context.profile, context.device_class = Profile.GPU, "H100"
    measured = check({"kind": "throughput"}, context).measurements
    assert measured["perf/tokens_per_s"]["normalized"] == 40000.0  # raw on GPU
    baselines.update(tmp_path / "baselines", "synthetic", "gpu", "H100", None, measured)
    assert check({"kind": "throughput"}, context).status is Status.PASSED
    context.device_class = "H200"
    assert check({"kind": "throughput"}, context).status is Status.SKIPPED


# -- fault outcomes -------------------------------------------------------------------------------
def _events(run: Path, *events: dict) -> None:
    start = json.loads((run / "run.json").read_text())["start_time"]
    edit_jsonl(run / "events.jsonl", lambda rs: rs + [{"time": start + 1.0, **e} for e in events])


def test_fault_recovered_passes_and_not_survived_fails(tmp_path: Path) -> None:
    ok = make_run(tmp_path / "ok")
    _events(ok, {"event": "fault_injected", "role": "engine:0"}, {"event": "restart", "role": "engine:0", "count": 1})
    spec = {"kind": "fault_outcome", "expect": "recovered", "max_restarts": 1, "min_restarts": 1}
    assert check(spec, ctx(tmp_path, main=ok)).status is Status.PASSED

    dead = make_run(tmp_path / "dead", status="failed", error="engine:0 died")
    _events(dead, {"event": "fault_injected", "role": "engine:0"})
    res = check(spec, ctx(tmp_path, main=dead))
    assert res.status is Status.FAILED and res.message.startswith("fault not survived: run.json status 'failed'")

    flappy = make_run(tmp_path / "flappy")
    _events(flappy, {"event": "fault_injected"}, *[{"event": "restart", "count": i} for i in range(3)])
    res = check(spec, ctx(tmp_path, main=flappy))
    assert res.status is Status.FAILED and "3 restarts > allowed 1" in res.message


def test_fault_never_happened_fails(tmp_path: Path, good: Path) -> None:
    res = check({"kind": "fault_outcome", "expect": "recovered"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "the fault never happened" in res.message


def test_fault_failed_fast_message(tmp_path: Path) -> None:
    run = make_run(tmp_path / "r", status="failed", error="reward function raised at step 1: ValueError")
    _events(run, {"event": "fault_injected", "kind": "engine_hook"})
    good_spec = {"kind": "fault_outcome", "expect": "failed_fast", "message": "(?i)reward", "within_s": 60}
    assert check(good_spec, ctx(tmp_path, main=run)).status is Status.PASSED
    res = check({**good_spec, "message": "checkpoint"}, ctx(tmp_path, main=run))
    assert res.status is Status.FAILED and "does not match 'checkpoint'" in res.message
    completed = make_run(tmp_path / "c")
    _events(completed, {"event": "fault_injected"})
    res = check(good_spec, ctx(tmp_path, main=completed))
    assert res.status is Status.FAILED and "expected a fast failure" in res.message


# -- learning and metric bounds -------------------------------------------------------------------
def test_learning_passes_and_flat_reward_fails(tmp_path: Path) -> None:
    spec = {"kind": "learning", "k": 2, "min_last": 0.4, "min_ratio": 2.0}
    rising = make_run(tmp_path / "up", reward_start=0.1, reward_slope=0.1)
    assert check(spec, ctx(tmp_path, main=rising)).status is Status.PASSED
    flat = make_run(tmp_path / "flat", reward_start=0.3, reward_slope=0.0)
    res = check(spec, ctx(tmp_path, main=flat))
    assert res.status is Status.FAILED and res.message.startswith("did not learn: mean rollout/reward_mean over steps 4..5")
    high_flat = make_run(tmp_path / "hf", reward_start=0.5, reward_slope=0.0)
    res = check(spec, ctx(tmp_path, main=high_flat))
    assert res.status is Status.FAILED and "< 2 x first-2 mean" in res.message


def test_metric_bound(tmp_path: Path, good: Path) -> None:
    assert check({"kind": "metric_bound", "key": "train/grad_norm", "value": 2}, ctx(tmp_path, main=good)).passed
    res = check({"kind": "metric_bound", "key": "train/grad_norm", "value": 0.5}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "first offending step 0" in res.message


def test_nan_in_metrics_is_caught(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "metrics.jsonl", lambda rs: [{**r, "train/loss": "nan"} if r["step"] == 1 else r for r in rs])
    other = make_run(tmp_path / "other")
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, ctx(tmp_path, a=good, b=other))
    assert res.status is Status.FAILED and "step 1: train/loss diverges: a=nan" in res.message


def test_check_crash_is_a_failure_not_an_error(tmp_path: Path, good: Path) -> None:
    res = check({"kind": "loss_parity", "runs": ["a", "zzz"]}, ctx(tmp_path, a=good))
    assert res.status is Status.FAILED and "check could not run" in res.message
