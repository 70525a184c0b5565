"""Every check passes on a healthy synthetic run and FAILS on the defect it exists to catch (fabricated
artifact files: each test plants one defect into a contract-valid run directory)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.artifacts import RunArtifacts
from harness.checks import CHECKS, CheckContext, Status, parse_check
from harness.profiles import Profile
from harness.synthetic import edit_jsonl, make_run


def ctx(tmp_path: Path, **runs: Path) -> CheckContext:
    return CheckContext(runs={k: RunArtifacts.load(v) for k, v in runs.items()}, root=tmp_path,
                        baselines_dir=tmp_path / "baselines", baseline_key="synthetic")


def set_metric(run: Path, key: str, value, steps=None) -> None:
    edit_jsonl(run / "metrics.jsonl", lambda rs: [{**r, key: value} if steps is None or r["step"] in steps else r
                                                  for r in rs])


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


def _as_sglang(recs, corrupt: bool = False, drop_layout: bool = False):
    """engine:1 becomes a stock SGLang server: its records hold SGLang-layout hashes, the trainer's ``layouts``."""
    for r in recs:
        sglang = {k.replace("q_proj", "qkv_proj"): "%016x" % (hash(v) & (2**64 - 1)) for k, v in r["checksums"].items()
                  if ".k_proj" not in k and ".v_proj" not in k}
        if r["side"] == "trainer" and not drop_layout:
            r["layouts"] = {"sglang": sglang}
        elif r["side"] == "engine:1":
            r["checksums"], r["layout"] = dict(sglang), "sglang"
            if corrupt and r["version"] == 2:
                r["checksums"]["model.layers.0.self_attn.qkv_proj.weight"] = "0123456789abcdef"
    return recs


def test_weights_in_sglang_layout_are_judged_against_the_trainers_sglang_hashes(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "weights.jsonl", _as_sglang)
    res = check({"kind": "weight_equality", "engines": 2}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


def test_a_wrong_sglang_hash_or_a_trainer_without_that_layout_fails(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "weights.jsonl", lambda rs: _as_sglang(rs, corrupt=True))
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert "version 2: engine:1 tensor 'model.layers.0.self_attn.qkv_proj.weight' checksum 0123456789ab" in res.message
    other = make_run(tmp_path / "other")
    edit_jsonl(other / "weights.jsonl", lambda rs: _as_sglang(rs, drop_layout=True))
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=other))
    assert res.status is Status.FAILED and "the trainer record has none of that layout" in res.message


def test_an_unverified_engine_record_fails_with_its_reason(tmp_path: Path, good: Path) -> None:
    def unverified(recs):
        for r in recs:
            if r["side"] == "engine:0" and r["version"] == 1:
                r["checksums"], r["unverified"] = None, "a stock SGLang MoE engine: experts fused"
        return recs

    edit_jsonl(good / "weights.jsonl", unverified)
    res = check({"kind": "weight_equality"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "version 1: engine:0 unverified: a stock SGLang MoE engine" in res.message


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


def test_parity_missing_step(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    edit_jsonl(b / "metrics.jsonl", lambda rs: rs[:-1])
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, ctx(tmp_path, a=a, b=b))
    assert "step 5: train/loss missing in b" in res.details["problems"]


def test_parity_fp32_pair_differing_by_1e3_fails_on_any_device(tmp_path: Path) -> None:
    """Tolerances follow the dtypes the runs computed in: an fp32 pair is held to fp32 even on a GPU."""
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b", loss_offset=1e-3)
    context = ctx(tmp_path, a=a, b=b)
    for profile in (Profile.CPU, Profile.GPU):
        context.profile = profile
        res = check({"kind": "loss_parity", "runs": ["a", "b"]}, context)
        assert res.status is Status.FAILED, profile
        assert res.message.startswith("step 0: train/loss diverges") and "atol 1e-06" in res.message


def test_parity_bf16_pair_gets_the_stated_bf16_tolerance(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", dtype="bfloat16")
    b = make_run(tmp_path / "b", dtype="bfloat16", loss_offset=5e-3)
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, ctx(tmp_path, a=a, b=b))
    assert res.status is Status.PASSED and "atol 0.01, rtol 0.02" in res.message, res.message
    mixed = make_run(tmp_path / "m", loss_offset=5e-3)  # fp32 against bf16: the coarser one decides
    assert check({"kind": "loss_parity", "runs": ["a", "m"]}, ctx(tmp_path, a=a, m=mixed)).status is Status.PASSED
    worse = make_run(tmp_path / "w", dtype="bfloat16", loss_offset=5e-2)
    assert check({"kind": "loss_parity", "runs": ["a", "w"]}, ctx(tmp_path, a=a, w=worse)).status is Status.FAILED


def test_parity_without_dtypes_needs_stated_tolerances(tmp_path: Path) -> None:
    a, b = make_run(tmp_path / "a"), make_run(tmp_path / "b")
    info = json.loads((b / "run.json").read_text())
    del info["dtypes"]
    (b / "run.json").write_text(json.dumps(info))
    res = check({"kind": "loss_parity", "runs": ["a", "b"]}, ctx(tmp_path, a=a, b=b))
    assert res.status is Status.FAILED and "run.json has no 'dtypes'" in res.message
    assert check({"kind": "loss_parity", "runs": ["a", "b"], "atol": 1e-6, "rtol": 0.0},
                 ctx(tmp_path, a=a, b=b)).status is Status.PASSED


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
MAX, P99, MEAN, KL = ("train/train_rollout_logprob_abs_diff_max", "train/train_rollout_logprob_abs_diff_p99",
                      "train/train_rollout_logprob_abs_diff", "train/train_rollout_kl")


def test_mismatch_passes_and_reports_the_worst_token(tmp_path: Path, good: Path) -> None:
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message
    assert res.message.startswith("fp32: step-0 rollout kl 1e-09; per-token |diff| max <= 1e-06 (bound 0.0001)")


def test_mismatch_step0_compares_the_engine_with_the_trainer(tmp_path: Path, good: Path) -> None:
    """The engine's log-probs 1e-3 off the trainer's on the same weights: the rollout kl catches it, although
    the trainer agrees with itself (ppo_kl 0)."""
    set_metric(good, KL, -1e-3, steps={0})
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message.startswith("step 0: |train/train_rollout_kl| = 0.001 > 1e-05 (the engine's log-probs")


def test_mismatch_trainer_against_itself_still_bounded(tmp_path: Path, good: Path) -> None:
    set_metric(good, "train/ppo_kl", 3e-6, steps={0})
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and res.message.startswith("step 0: train/ppo_kl = 3e-06 not < 1e-08")


def test_mismatch_max_over_every_token_catches_what_the_mean_hides(tmp_path: Path, good: Path) -> None:
    """A decode bug on a few late tokens: the mean stays small (2e-7), the worst token is 1e-3."""
    set_metric(good, MAX, 1e-3, steps={4})
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message == f"step 4: {MAX} = 0.001 > 0.0001"
    assert res.measurements["worst_mean"] < 1e-6  # the mean alone would have passed


def test_mismatch_mean_over_threshold_fails(tmp_path: Path, good: Path) -> None:
    set_metric(good, MEAN, 5e-4, steps={3})
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and f"step 3: {MEAN} = 0.0005 > 1e-05" in res.message


def test_mismatch_bf16_pair_bounds_the_p99_token(tmp_path: Path) -> None:
    run = make_run(tmp_path / "bf", dtype="bfloat16")
    set_metric(run, MAX, 0.3)  # a bf16 max may be one ulp-sized outlier; the p99 is bounded
    set_metric(run, MEAN, 8e-3)
    set_metric(run, P99, 5e-2)
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=run))
    assert res.status is Status.PASSED and res.message.startswith("bf16:") and "p99" in res.message, res.message
    set_metric(run, P99, 0.2, steps={2})
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=run))
    assert res.status is Status.FAILED and res.message == f"step 2: {P99} = 0.2 > 0.1"
    assert check({"kind": "logprob_mismatch", "worst_token_max": 0.25}, ctx(tmp_path, main=run)).passed


def test_mismatch_missing_metrics_fail(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "metrics.jsonl", lambda rs: [{k: v for k, v in r.items() if k != MAX} for r in rs])
    res = check({"kind": "logprob_mismatch"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and res.message.startswith(f"no {MAX} in metrics.jsonl")


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


def test_accounting_trainer_that_drops_a_sample_fails(tmp_path: Path, good: Path) -> None:
    """The rollout says trained, the trainer's own report lacks the sample: it never reached the loss."""
    edit_jsonl(good / "samples.jsonl", lambda rs: [r for r in rs if not (r["fate"] == "consumed" and r["step"] == 3
                                                                         and r["index"] == 26)])
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message == ("step 3: sample group 13 index 26 trained by the rollout's record, but the trainer never "
                           "consumed it")


def test_accounting_trainer_that_consumes_an_unrecorded_sample_fails(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "samples.jsonl", lambda rs: [*rs, {"step": 1, "group_index": 99, "index": 990,
                                                         "fate": "consumed", "passes": 1, "reason": None}])
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message == "step 1: the trainer consumed sample group 99 index 990, which the rollout never recorded as trained"


def test_accounting_trainer_report_at_another_step_or_uneven_fails(tmp_path: Path, good: Path) -> None:
    def shift(recs):
        for r in recs:
            if r["fate"] == "consumed" and r["index"] == 0:
                r["step"] = 5
            if r["fate"] == "consumed" and r["index"] == 3:
                r["passes"] = 2
        return recs

    edit_jsonl(good / "samples.jsonl", shift)
    problems = " | ".join(check({"kind": "sample_accounting"}, ctx(tmp_path, main=good)).details["problems"])
    assert "step 5: the trainer consumed sample group 0 index 0, which was trained at step [0]" in problems
    assert "step 0: the trainer consumed samples unevenly (passes ['1', '2'])" in problems


def test_accounting_without_a_trainer_report_fails_unless_waived(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "samples.jsonl", lambda rs: [r for r in rs if r["fate"] != "consumed"])
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED
    assert res.message == "no consumed records: the trainer reported no sample it trained on"
    assert check({"kind": "sample_accounting", "trainer_report": False}, ctx(tmp_path, main=good)).passed


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
    def recycle(recs):  # sample (0, 0) is recycled at step 0 and trained (and consumed) at step 1
        first = dict(recs[0], fate="recycled")
        consumed = next(r for r in recs if r["fate"] == "consumed" and r["index"] == 0)
        rest = [r for r in recs[1:] if r is not consumed]
        return [first, *rest, dict(recs[0], step=1, attempts=2), dict(consumed, step=1)]

    edit_jsonl(good / "samples.jsonl", recycle)
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


def test_accounting_trained_twice_fails_unless_rolled_back(tmp_path: Path, good: Path) -> None:
    edit_jsonl(good / "samples.jsonl", lambda recs: [*recs, dict(recs[0], step=1)])
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "has 2 final fates" in res.message

    def rolled_back(recs):
        first = [r for r in recs if r["step"] == 0]
        rest = [r for r in recs if r["step"] != 0]
        rollback = [dict(r, fate="recycled", reason="global_restart: rolled back to step 0")
                    for r in first if r["fate"] == "trained"]
        redo = [dict(r, attempts=2) if r["fate"] == "trained" else r for r in first]
        return [*first, *rollback, *redo, *rest]

    edit_jsonl(good / "samples.jsonl", lambda recs: rolled_back(recs[:-1]))  # without the planted duplicate
    res = check({"kind": "sample_accounting"}, ctx(tmp_path, main=good))
    assert res.status is Status.PASSED, res.message


# -- throughput -----------------------------------------------------------------------------------
# (harness.baselines, the stored-baseline half; tests/test_harness_baselines.py has the rest)


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


def test_fault_without_a_restart_fails_min_restarts(tmp_path: Path) -> None:
    """The old engine-hang scenario: the fault fired, the run completed, but nothing noticed it."""
    quiet = make_run(tmp_path / "quiet")
    _events(quiet, {"event": "fault_injected", "role": "engine:0", "signal": "SIGSTOP"})
    res = check({"kind": "fault_outcome", "expect": "recovered", "max_restarts": 1, "min_restarts": 1},
                ctx(tmp_path, main=quiet))
    assert res.status is Status.FAILED
    assert res.message == "no recovery recorded: 0 restart event(s), expected at least 1"


def test_proxy_faults_that_hit_too_few_requests_fail_min_injected(tmp_path: Path) -> None:
    """A proxy whose faults never met a request (the run completed, but nothing was tested) fails the check."""
    spec = {"kind": "fault_outcome", "expect": "recovered", "max_restarts": 0,
            "min_injected": {"dropped": 1, "errors": 1, "delayed": 1}}
    idle = make_run(tmp_path / "idle")
    _events(idle, {"event": "fault_injected", "kind": "http_proxy"},
            {"event": "proxy_stats", "name": "b", "stats": {"requests": 40, "forwarded": 38, "dropped": 1, "errors": 1}})
    res = check(spec, ctx(tmp_path, main=idle))
    assert res.status is Status.FAILED and "injected too little to prove anything: {'delayed': 0}" in res.message
    hit = make_run(tmp_path / "hit")
    _events(hit, {"event": "fault_injected", "kind": "http_proxy"},
            {"event": "proxy_stats", "name": "b", "stats": {"dropped": 2, "errors": 1, "delayed": 4}})
    res = check(spec, ctx(tmp_path, main=hit))
    assert res.status is Status.PASSED and "through proxy faults" in res.message


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


def test_learning_that_peaks_and_decays_fails_max_drop(tmp_path: Path) -> None:
    spec = {"kind": "learning", "k": 2, "min_last": 0.4, "min_ratio": 2.0, "max_drop": 0.05}
    run = make_run(tmp_path / "peak", reward_start=0.1, reward_slope=0.1)  # steps 0..5: 0.1 .. 0.6
    assert check(spec, ctx(tmp_path, main=run)).status is Status.PASSED
    edit_jsonl(run / "metrics.jsonl", lambda rs: [{**r, "rollout/reward_mean": [0.1, 0.2, 0.8, 0.9, 0.6, 0.7][r["step"]]}
                                                  for r in rs])
    res = check(spec, ctx(tmp_path, main=run))
    assert res.status is Status.FAILED, res.message
    assert res.message.startswith("did not keep it: mean rollout/reward_mean over steps 4..5 is 0.65, 0.2 below its "
                                  "best 2-step mean 0.85 (steps 2..3"), res.message
    assert check({**spec, "max_drop": 0.25}, ctx(tmp_path, main=run)).status is Status.PASSED


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


# -- placement ------------------------------------------------------------------------------------
def _placed(run: Path, layout: dict[str, tuple[str, list[str]]]) -> Path:
    """Replace the run's process_started events with ``role -> (node, gpu ids)``."""
    started = [{"event": "process_started", "role": role, "node_id": node, "gpu_ids": gpus}
               for role, (node, gpus) in layout.items()]
    edit_jsonl(run / "events.jsonl", lambda rs: [r for r in rs if r.get("event") != "process_started"] + started)
    return run


def test_placement_colocated_layout_passes(tmp_path: Path, good: Path) -> None:
    run = _placed(good, {"trainer:0": ("n1", ["0"]), "trainer:1": ("n1", ["1"]),
                         "engine:0": ("n1", ["0"]), "engine:1": ("n1", ["1"])})
    res = check({"kind": "placement", "trainers": 2, "engines": 2, "engines_share": "colocated", "nodes": 1},
                ctx(tmp_path, main=run))
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("layout, params, message", [
    ({"trainer:0": ("n1", ["0"]), "trainer:1": ("n1", ["0"]), "engine:0": ("n1", ["0"])},
     {"trainers": 2, "engines": 1}, "trainer:1 and trainer:0 share GPU 0"),
    ({"trainer:0": ("n1", ["0"]), "trainer:1": ("n2", ["0"]), "engine:0": ("n1", ["1"]), "engine:1": ("n2", ["0"])},
     {"trainers": 2, "engines": 2, "engines_share": "colocated"}, "engine:0 is not on trainer:0's GPU"),
    ({"trainer:0": ("n1", ["0"]), "engine:0": ("n1", ["0"])},
     {"trainers": 1, "engines": 1, "engines_share": "separate"}, "engine:0 shares a GPU with a trainer rank"),
    ({"trainer:0": ("n1", ["0"]), "engine:0": ("n1", ["1"])},
     {"trainers": 1, "engines": 1, "nodes": 2}, "span 1 node(s), expected 2"),
    ({"trainer:0": ("n1", ["0"])}, {"trainers": 1, "engines": 1}, "0 engine(s) started"),
])
def test_placement_names_what_is_misplaced(tmp_path: Path, good: Path, layout, params, message) -> None:
    res = check({"kind": "placement", **params}, ctx(tmp_path, main=_placed(good, layout)))
    assert res.status is Status.FAILED and message in res.message, res.message


# -- interrupted / checkpoints_complete -----------------------------------------------------------------------
def _interrupted_run(good: Path, *, end: dict, leftovers: list[int] = (), resume_step: int | None = 3) -> Path:
    events = [{"event": "checkpoint_saved", "step": s, "time": 10.0 + s} for s in range(3)]
    events += [{"event": "fault_injected", "signal": "SIGTERM", "time": 13.0},
               {"event": "run_end", "time": 14.0, **end},
               {"event": "launch_cleanup", "killed_pids": list(leftovers), "time": 14.5}]
    if resume_step is not None:
        events += [{"event": "resume", "step": resume_step, "time": 20.0},
                   {"event": "run_end", "status": "completed", "exit_code": 0, "time": 30.0}]
    edit_jsonl(good / "events.jsonl", lambda rs: [r for r in rs if r.get("event") not in ("run_end", "resume")] + events)
    return good


INTERRUPTED = {"status": "interrupted", "signal": "SIGTERM", "exit_code": 143}


def test_interrupted_passes_for_a_clean_stop_and_resume(tmp_path: Path, good: Path) -> None:
    run = _interrupted_run(good, end=INTERRUPTED)
    res = check({"kind": "interrupted", "signal": "SIGTERM", "resumed": True}, ctx(tmp_path, main=run))
    assert res.status is Status.PASSED, res.message


@pytest.mark.parametrize("end, leftovers, resume_step, message", [
    ({"status": "failed", "exit_code": 1}, [], 3, "the first run_end is status 'failed'"),
    (INTERRUPTED, [4242], 3, "processes left running after a launch ended (killed by the harness): [4242]"),
    (INTERRUPTED, [], 2, "resumed at step 2, expected 3"),
    (INTERRUPTED, [], None, "no resume event after the interruption"),
])
def test_interrupted_names_what_went_wrong(tmp_path: Path, good: Path, end, leftovers, resume_step, message) -> None:
    run = _interrupted_run(good, end=end, leftovers=leftovers, resume_step=resume_step)
    res = check({"kind": "interrupted", "signal": "SIGTERM", "resumed": True}, ctx(tmp_path, main=run))
    assert res.status is Status.FAILED and message in res.message, res.message


def test_checkpoints_complete_finds_a_torn_save(tmp_path: Path, good: Path) -> None:
    root = good / "ckpt"
    for step in (0, 1):
        (root / f"iter_{step:07d}").mkdir(parents=True)
        (root / f"iter_{step:07d}" / "driver_state.pkl").write_bytes(b"x")
        (root / f"iter_{step:07d}" / "model.safetensors").write_bytes(b"x")
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    spec = {"kind": "checkpoints_complete", "save_dir": "ckpt"}
    assert check(spec, ctx(tmp_path, main=good)).status is Status.PASSED
    (root / "iter_0000002.partial").mkdir()
    res = check(spec, ctx(tmp_path, main=good))
    assert res.status is Status.FAILED and "iter_0000002.partial: a save left half written" in res.message
