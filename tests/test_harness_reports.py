"""Reports, baselines, the CI gate and the CLI, from synthetic results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness import baselines
from harness.cli import main as cli
from harness.gate import judge, markdown
from harness.report import render_summary, write_html
from harness.results import ScenarioResult, write_results

REPO = Path(__file__).resolve().parents[1]


MACHINE = "cpu: Test CPU x2"


def throughput_check(value: float, status: str = "no_baseline", key: str = "colocate-cpu") -> dict:
    return {"kind": "throughput", "name": "throughput", "status": status, "message": "throughput message",
            "details": {"baseline_key": key},
            "measurements": {"value": value, "metric": "samples_per_s", "baseline_key": key, "spec": "abc",
                             "min_tolerance": 0.35}}


def results_file(tmp_path: Path, value: float = 100.0, extra: list[dict] | None = None) -> Path:
    scenarios = [
        ScenarioResult(name="colocate-cpu", status="passed", message="5 checks passed", machine_class=MACHINE,
                       checks=[throughput_check(value)], test={"outcome": "passed"},
                       series={"a": {"train/loss": [[0, 1.0], [1, 0.5]], "rollout/reward_mean": [[0, 0.1], [1, None]]},
                               "b": {"train/loss": [[0, 1.0], [1, 0.6]]}}),
        ScenarioResult(name="opd-cpu", status="unsupported", message="engine: not supported yet: --use-opd",
                       test={"outcome": "xfailed", "reason": "waits for issue 5 (Modes)"}),
        ScenarioResult(name="colocate-gpu", status="skipped", message="gpu scenario: run with --harness-profile gpu",
                       test={"outcome": "skipped", "reason": "gpu scenario: run with --harness-profile gpu"}),
    ]
    scenarios += [ScenarioResult.model_validate(e) for e in extra or []]
    return write_results(tmp_path / "results.json", scenarios)


def test_html_report_embeds_plots_and_overlays(tmp_path: Path) -> None:
    path = write_html(json.loads(results_file(tmp_path).read_text()), tmp_path / "report.html")
    html = path.read_text()
    assert html.count("data:image/png;base64,") == 2  # colocate: loss/reward and throughput; the others none
    assert "waits for issue 5 (Modes)" in html and "xfailed" in html
    assert ">no baseline</span>" in html and ">skipped</span>" in html
    assert "throughput: 100 samples_per_s, no baseline for cpu: Test CPU x2" in html


def test_html_plots_throughput_per_run_against_the_baseline_band(tmp_path: Path) -> None:
    from harness.report.html import throughput_points

    band = {"median": 100.0, "lower": 65.0, "values": [97.0, 99.0, 100.0, 101.0, 103.0]}
    runs = [{"name": f"colocate-cpu[run {i}]", "status": "passed", "machine_class": MACHINE,
             "checks": [dict(throughput_check(v, status="passed"),
                             measurements={**throughput_check(v)["measurements"], "baseline": band})]}
            for i, v in enumerate((98.0, 60.0, 101.0), start=1)]
    points = throughput_points(runs)
    assert points["colocate-cpu"]["values"] == [98.0, 60.0, 101.0] and points["colocate-cpu"]["baseline"] == band
    html = write_html({"scenarios": runs}, tmp_path / "r.html").read_text()
    assert "alt='throughput colocate-cpu'" in html


def test_terminal_summary_fits_one_screen() -> None:
    scenarios = [{"name": f"s{i}", "status": "passed", "checks": [], "duration_s": 1.0, "message": "ok"}
                 for i in range(20)]
    text = render_summary(scenarios, width=100)
    assert len(text.splitlines()) < 30 and "20 passed" in text


def test_terminal_summary_keeps_passed_no_baseline_and_skipped_apart(tmp_path: Path) -> None:
    data = json.loads(results_file(tmp_path).read_text())
    text = render_summary(data["scenarios"], width=140)
    assert "│ colocate-cpu │ no baseline │" in text and "100 samples_per_s, no baseline for cpu: Test CPU x2" in text
    assert "│ colocate-gpu │ skipped" in text and "1 no baseline, 1 skipped, 1 xfailed" in text


def test_gate_passes_with_xfail_skip_and_no_baseline_and_fails_on_regression(tmp_path: Path) -> None:
    data = json.loads(results_file(tmp_path).read_text())
    verdict = judge(data, tmp_path / "bl")
    assert verdict.ok, verdict.reasons
    md = markdown(verdict)
    assert md.startswith("## relax scenario gate: PASS") and "| opd-cpu | xfailed (expected) |" in md
    assert "| colocate-cpu | no baseline |" in md and "| colocate-gpu | skipped |" in md
    baselines.record(tmp_path / "bl", MACHINE, {"colocate-cpu": [
        {"value": v, "metric": "samples_per_s", "spec": "abc"} for v in (100.0, 100.0, 100.0, 100.0, 100.0)]}, None)
    assert judge(data, tmp_path / "bl").ok
    verdict = judge(json.loads(results_file(tmp_path, value=50.0).read_text()), tmp_path / "bl")
    assert not verdict.ok
    assert verdict.reasons == ["colocate-cpu: throughput regression: samples_per_s 50 vs baseline median 100 "
                               "(-50.0%; fails below 65, -35%) REGRESSION"]


def test_gate_fails_on_failure_xpass_and_missing_baseline_when_required(tmp_path: Path) -> None:
    extra = [{"name": "broken", "status": "failed", "message": "check learning: did not learn",
              "test": {"outcome": "failed"}},
             {"name": "fixed", "status": "passed", "message": "ok", "test": {"outcome": "xpassed"}}]
    data = json.loads(results_file(tmp_path, extra=extra).read_text())
    verdict = judge(data, tmp_path / "empty", require_baselines=True)
    assert "broken: check learning: did not learn" in verdict.reasons
    assert "fixed: passed although marked xfail: remove the marker" in verdict.reasons
    assert any("no baseline for cpu: Test CPU x2 (scenario colocate-cpu)" in r for r in verdict.reasons)
    assert not judge({"scenarios": []}, tmp_path).ok


def test_ci_gate_module_writes_summary(tmp_path: Path) -> None:
    summary = tmp_path / "summary.md"
    proc = subprocess.run([sys.executable, "-m", "ci.gate", str(results_file(tmp_path)), "--baselines",
                           str(tmp_path / "none"), "--summary", str(summary)], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "relax scenario gate: PASS" in summary.read_text()


def test_cli_list_report_and_gate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli(["list", "--family", "parity"]) == 0
    out = capsys.readouterr().out
    assert "parity-resume-cpu" in out and "colocate-cpu" not in out
    results = results_file(tmp_path)
    assert cli(["report", str(results)]) == 1  # opd is unsupported: not all passed
    assert (tmp_path / "report.html").exists()
    assert cli(["gate", str(results), "--baselines", str(tmp_path / "bl")]) == 0
    assert cli(["gate", str(results), "--baselines", str(tmp_path / "bl"), "--require-baselines"]) == 1


def test_cli_run_with_fake_engine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    specs = tmp_path / "specs"
    specs.mkdir()
    (specs / "demo.yaml").write_text(
        "family: demo\nscenarios:\n  - name: demo-cpu\n    engine_flags: [--num-rollout, '2']\n"
        "    checks: [{kind: weight_equality}, {kind: sample_accounting}]\n")
    code = cli(["run", "demo-cpu", "--specs", str(specs), "--results", str(tmp_path / "out"),
                "--engine-cmd", f"{sys.executable} -m harness.fake_engine"])
    assert code == 0, capsys.readouterr().out
    data = json.loads((tmp_path / "out" / "results.json").read_text())
    assert data["scenarios"][0]["status"] == "passed"
    assert cli(["run", "nope", "--specs", str(specs)]) == 2


@pytest.mark.parametrize("argv, text, line", [
    (["list", "--specs", "{d}/specs"], "scenarios:\n  - name: x\n    bogus: 1\n",
     "{d}/specs/a.yaml: scenario 'x': bogus: Extra inputs are not permitted"),
    (["list", "--specs", "{d}/specs"], "{bad", "{d}/specs/a.yaml: invalid YAML: while parsing a flow mapping"),
    (["list", "--specs", "{d}/specs"], "scenarios: 3\n", "{d}/specs/a.yaml: scenarios must be a list of mappings"),
    (["run", "--all", "--specs", "{d}/none"], None, "{d}/none: no such specs directory"),
    (["report", "{d}/specs/a.yaml"], "{bad", "{d}/specs/a.yaml: not a results JSON (Expecting property name "
     "enclosed in double quotes: line 1 column 2 (char 1))"),
    (["report", "{d}/r.json"], None, "{d}/r.json: no such results file"),
    (["gate", "{d}/r.json"], None, "{d}/r.json: no such results file"),
])
def test_bad_specs_and_results_are_one_line(tmp_path: Path, capsys, argv: list[str], text: str | None,
                                            line: str) -> None:
    (tmp_path / "specs").mkdir()
    if text is not None:
        (tmp_path / "specs" / "a.yaml").write_text(text)
    assert cli([a.format(d=tmp_path) for a in argv]) == 2
    err = capsys.readouterr().err
    prefix = "gate: " if argv[0] == "gate" else "relax-harness: "
    assert err == prefix + line.format(d=tmp_path) + "\n"


def test_html_report_without_matplotlib_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from harness.report import html as report_html

    monkeypatch.setattr(report_html, "have_matplotlib", lambda: False)
    html = write_html(json.loads(results_file(tmp_path).read_text()), tmp_path / "report.html").read_text()
    assert "data:image/png" not in html and "plots need matplotlib" in html and ">no baseline</span>" in html


def test_results_name_the_commit_they_ran_from(tmp_path, monkeypatch) -> None:
    from harness.results import load_results, write_results

    monkeypatch.setenv("RELAX_COMMIT", "abc123def456")
    assert load_results(write_results(tmp_path / "r.json", []))["environment"]["commit"] == "abc123def456"
    monkeypatch.delenv("RELAX_COMMIT")
    commit = load_results(write_results(tmp_path / "r.json", []))["environment"]["commit"]
    assert commit == "unknown" or len(commit) == 12  # this checkout's HEAD


def test_a_reader_that_leaves_early_ends_the_listing_quietly() -> None:
    """`relax-harness list | head -1`: the listing's writes after the reader left are no traceback."""
    import subprocess

    proc = subprocess.Popen([sys.executable, "-m", "harness", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            cwd=Path(__file__).resolve().parents[1])
    proc.stdout.close()  # before the listing is written: its flush meets a closed pipe
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 141 and b"Traceback" not in err, err.decode()[-2000:]
