"""Throughput: the one figure per scenario, stored baselines per machine class, and their recording."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness import baselines
from harness.artifacts import RunArtifacts
from harness.checks import CheckContext, Status, parse_check
from harness.checks.throughput import measure
from harness.cli import main as cli
from harness.profiles import Profile, class_slug, machine_class
from harness.results import write_results
from harness.synthetic import make_run

H100 = "gpu: NVIDIA H100 80GB HBM3 x1"
H200 = "gpu: NVIDIA H200 x1"
FAKE = f"{sys.executable} -m harness.fake_engine"


def ctx(tmp_path: Path, run: Path, machine: str = "cpu: Test CPU x2", **kw) -> CheckContext:
    return CheckContext(runs={"main": RunArtifacts.load(run)}, baselines_dir=tmp_path / "bl", baseline_key="synthetic",
                        machine_class=machine, spec_digest="abc", root=tmp_path, **kw)


def check(spec: dict, context: CheckContext):
    return parse_check({"kind": "throughput", **spec}).run_check(context)


def runs_of(value: float, n: int = 5, spread: float = 0.02, spec: str = "abc") -> list[dict]:
    return [{"value": value * (1 + spread * (i - n // 2) / n), "metric": "samples_per_s", "spec": spec}
            for i in range(n)]


def test_one_figure_from_wall_time_between_step_ends(tmp_path: Path) -> None:
    run = RunArtifacts.load(make_run(tmp_path / "r", steps=6, groups=4, n=2, step_time_s=0.5, response_len=20.0))
    got = measure(run, "samples", skip_steps=2, min_steps=3)
    assert got == {"value": pytest.approx(8 / 0.5), "steps": 4.0, "window_s": pytest.approx(2.0)}
    assert measure(run, "tokens", skip_steps=2, min_steps=3)["value"] == pytest.approx(8 * 20 / 0.5)
    assert measure(run, "samples", skip_steps=0, min_steps=3)["window_s"] == pytest.approx(3.0)  # from step_start 0
    with pytest.raises(ValueError, match="6 step_end events; need 4 warm-up"):
        measure(run, "samples", skip_steps=4, min_steps=3)


def test_slow_steps_lower_the_figure(tmp_path: Path) -> None:
    fast = measure(RunArtifacts.load(make_run(tmp_path / "f", step_time_s=0.5)), "samples", 2, 3)["value"]
    slow = measure(RunArtifacts.load(make_run(tmp_path / "s", step_time_s=0.65)), "samples", 2, 3)["value"]
    assert slow / fast == pytest.approx(0.5 / 0.65)


def test_no_baseline_is_its_own_outcome_never_passed(tmp_path: Path) -> None:
    res = check({}, ctx(tmp_path, make_run(tmp_path / "r")))
    assert res.status is Status.NO_BASELINE and not res.passed
    assert "no baseline for cpu: Test CPU x2 (scenario synthetic)" in res.message
    assert res.measurements["value"] == pytest.approx(16.0)
    required = check({}, ctx(tmp_path, make_run(tmp_path / "r2"), require_baselines=True))
    assert required.status is Status.FAILED and required.message.endswith("(--require-baselines)")


def test_baseline_band_from_spread_and_the_checks_own_tolerance(tmp_path: Path) -> None:
    baselines.record(tmp_path / "bl", "cpu: Test CPU x2", {"synthetic": runs_of(16.0, spread=0.0)}, "c0ffee")
    context = ctx(tmp_path, make_run(tmp_path / "same", step_time_s=0.5))
    context.profile = Profile.GPU  # min tolerance 10%
    assert check({}, context).status is Status.PASSED
    slower = ctx(tmp_path, make_run(tmp_path / "slow", step_time_s=0.6))  # -16.7%
    slower.profile = Profile.GPU
    res = check({}, slower)
    assert res.status is Status.FAILED and "REGRESSION" in res.message and "-16.7%" in res.message
    assert check({"tolerance": 0.2}, slower).status is Status.PASSED  # the check's own tolerance wins
    # a noisy machine class: 3 x the runs' relative spread widens the band beyond the minimum
    baselines.record(tmp_path / "bl", "cpu: Test CPU x2", {"synthetic": [
        {"value": v, "metric": "samples_per_s", "spec": "abc"} for v in (12.0, 14.0, 16.0, 18.0, 20.0)]}, None)
    stored = baselines.entry(tmp_path / "bl", "cpu: Test CPU x2", "synthetic")
    assert stored["tolerance"] == pytest.approx(3 * 3.1622776601683795 / 16.0)
    assert check({}, slower).status is Status.PASSED


def test_gpu_classes_are_kept_apart(tmp_path: Path) -> None:
    baselines.record(tmp_path / "bl", H100, {"synthetic": runs_of(16.0)}, None)
    run = make_run(tmp_path / "r")
    assert check({}, ctx(tmp_path, run, machine=H100)).status is Status.PASSED
    h200 = check({}, ctx(tmp_path, run, machine=H200))
    assert h200.status is Status.NO_BASELINE and "no baseline for gpu: NVIDIA H200 x1" in h200.message
    assert (tmp_path / "bl" / "gpu-nvidia-h100-80gb-hbm3-x1.json").exists()


def test_baseline_recorded_for_other_flags_does_not_count(tmp_path: Path) -> None:
    baselines.record(tmp_path / "bl", "cpu: Test CPU x2", {"synthetic": runs_of(16.0, spec="old")}, None)
    res = check({}, ctx(tmp_path, make_run(tmp_path / "r")))
    assert res.status is Status.NO_BASELINE and "recorded for other scenario flags (spec old != abc)" in res.message


def test_record_needs_five_runs_of_one_scenario_version(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least 5 runs, got 4"):
        baselines.record(tmp_path, H100, {"x": runs_of(1.0, n=4)}, None)
    with pytest.raises(ValueError, match="disagree"):
        baselines.record(tmp_path, H100, {"x": runs_of(1.0, n=3) + runs_of(1.0, n=2, spec="other")}, None)
    path = baselines.record(tmp_path, H100, {"x": runs_of(100.0)}, "c0ffee")
    data = json.loads(path.read_text())
    assert data["machine_class"] == H100 and data["scenarios"]["x"]["runs"] == 5
    assert data["scenarios"]["x"]["median"] == pytest.approx(100.0) and data["scenarios"]["x"]["commit"] == "c0ffee"


def test_machine_class_names_the_cpu_and_its_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RELAX_HARNESS_MACHINE_CLASS", raising=False)
    monkeypatch.setattr("harness.profiles.cpu_model", lambda: "AMD EPYC 7B13")
    monkeypatch.setattr("harness.profiles.cpu_cores", lambda: 2)
    assert machine_class(Profile.CPU) == "cpu: AMD EPYC 7B13 x2"
    assert class_slug("cpu: AMD EPYC 7B13 x2") == "cpu-amd-epyc-7b13-x2"
    monkeypatch.setenv("RELAX_HARNESS_MACHINE_CLASS", "cpu: other x4")
    assert machine_class(Profile.CPU) == "cpu: other x4"


def _results_with_runs(tmp_path: Path, name: str, values: list[float], machine: str = H100) -> Path:
    scenarios = [{"name": f"{name}[run {i}]", "status": "passed", "machine_class": machine, "checks": [
        {"kind": "throughput", "name": "throughput", "status": "no_baseline", "message": "",
         "measurements": {"value": v, "metric": "samples_per_s", "baseline_key": name, "spec": "abc",
                          "min_tolerance": 0.1}}]} for i, v in enumerate(values)]
    path = tmp_path / f"{name}-{len(values)}.json"
    path.write_text(json.dumps({"scenarios": scenarios}))
    return path


def test_record_from_a_gpu_sessions_results(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    five = _results_with_runs(tmp_path, "colocate-gpu", [210.0, 205.0, 212.0, 208.0, 214.0])
    assert cli(["baseline", "record", "--from", str(five), "--baselines", str(tmp_path / "bl")]) == 0
    out = capsys.readouterr().out
    assert f"baselines for {H100}:" in out and "colocate-gpu: median 210 samples_per_s" in out
    stored = json.loads((tmp_path / "bl" / "gpu-nvidia-h100-80gb-hbm3-x1.json").read_text())
    assert stored["scenarios"]["colocate-gpu"]["values"] == [210.0, 205.0, 212.0, 208.0, 214.0]
    four = _results_with_runs(tmp_path, "colocate-gpu", [1.0, 2.0, 3.0, 4.0])
    assert cli(["baseline", "record", "--from", str(four), "--baselines", str(tmp_path / "bl")]) == 1
    assert "a baseline needs at least 5 runs, got 4" in capsys.readouterr().err
    other = _results_with_runs(tmp_path, "colocate-gpu", [1.0], machine=H200)
    assert cli(["baseline", "record", "--from", str(five), str(other), "--baselines", str(tmp_path / "bl")]) == 1
    assert "several machine classes" in capsys.readouterr().err
    failed = json.loads(five.read_text())
    failed["scenarios"][2]["status"] = "failed"
    five.write_text(json.dumps(failed))
    assert cli(["baseline", "record", "--from", str(five), "--baselines", str(tmp_path / "bl")]) == 1
    assert "did not pass" in capsys.readouterr().err


def test_record_command_runs_each_scenario_five_times_then_the_check_compares(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RELAX_HARNESS_MACHINE_CLASS", "cpu: Test CPU x2")
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "t.yaml").write_text(
        "family: t\nscenarios:\n  - name: tput-cpu\n    engine_flags: [--num-rollout, '5', --fake-step-s, '0.02']\n"
        "    checks: [{kind: sample_accounting}, {kind: throughput, skip_steps: 1}]\n"
        "  - name: plain-cpu\n    checks: [{kind: sample_accounting}]\n")
    bl = tmp_path / "bl"
    run = ["run", "tput-cpu", "--specs", str(specs), "--results", str(tmp_path / "r"), "--baselines", str(bl),
           "--engine-cmd", FAKE]
    assert cli(run) == 0
    assert "no baseline for cpu: Test CPU x2" in capsys.readouterr().out
    assert cli(run + ["--require-baselines"]) == 1
    assert cli(["baseline", "record", "--runs", "4", "--specs", str(specs), "--baselines", str(bl)]) == 1
    assert cli(["baseline", "record", "--specs", str(specs), "--baselines", str(bl), "--engine-cmd", FAKE,
                "--results", str(tmp_path / "rec")]) == 0
    out = capsys.readouterr().out
    assert "recording tput-cpu on cpu: Test CPU x2: 5 runs each" in out and "tput-cpu run 5/5" in out
    stored = baselines.entry(bl, "cpu: Test CPU x2", "tput-cpu")
    assert stored["runs"] == 5 and stored["metric"] == "samples_per_s"
    # compared now (whether this run is fast enough depends on the machine's load: no timing verdict here)
    cli(run + ["--require-baselines"])
    data = json.loads((tmp_path / "r" / "results.json").read_text())
    tput = data["scenarios"][0]["checks"][1]
    assert tput["status"] in ("passed", "failed") and "vs baseline median" in tput["message"]
    # the stored figure is for these flags: changing them makes the baseline stale
    spec = (specs / "t.yaml").read_text().replace("'5'", "'6'")
    (specs / "t.yaml").write_text(spec)
    assert cli(run + ["--require-baselines"]) == 1
    tput = json.loads((tmp_path / "r" / "results.json").read_text())["scenarios"][0]["checks"][1]
    assert "vs baseline median" not in tput["message"]  # a stale baseline is no baseline


def test_gate_rejudges_with_the_checks_tolerance_and_lists_no_baseline(tmp_path: Path) -> None:
    from harness.gate import judge, markdown

    baselines.record(tmp_path / "bl", H100, {"colocate-gpu": runs_of(200.0, spread=0.0)}, None)

    def results(value: float, machine: str = H100, min_tol: float = 0.1) -> dict:
        sc = {"name": "colocate-gpu", "status": "passed", "machine_class": machine, "test": {"outcome": "passed"},
              "checks": [{"kind": "throughput", "name": "throughput", "status": "passed", "message": "",
                          "measurements": {"value": value, "metric": "samples_per_s", "baseline_key": "colocate-gpu",
                                           "spec": "abc", "min_tolerance": min_tol}}]}
        return json.loads(write_results(tmp_path / "r.json", []).read_text()) | {"scenarios": [sc]}

    assert judge(results(195.0), tmp_path / "bl").ok
    slow = judge(results(170.0), tmp_path / "bl")
    assert not slow.ok and "REGRESSION" in slow.reasons[0] and "-15.0%" in slow.reasons[0]
    assert judge(results(170.0, min_tol=0.2), tmp_path / "bl").ok  # the check's own tolerance, not the profile's
    h200 = judge(results(100.0, machine=H200), tmp_path / "bl")
    assert h200.ok and h200.rows == [("colocate-gpu", "no baseline", "")]
    assert "### Throughput without a baseline (not judged)" in markdown(h200)
    assert not judge(results(100.0, machine=H200), tmp_path / "bl", require_baselines=True).ok
