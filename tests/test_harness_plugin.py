"""The pytest plugin, tested the way pytest tests plugins: pytester writes a conftest and a test
file into a temp dir, runs pytest, and we match the output lines and the files it wrote."""

from __future__ import annotations

import json
import sys

import pytest

pytest_plugins = ["pytester"]

CONFTEST = 'pytest_plugins = ["harness.pytest_plugin"]\n'
FAKE = f"{sys.executable} -m harness.fake_engine"

TESTS = '''
import pytest

GOOD = {"name": "good", "engine_flags": ["--num-rollout", "4"],
        "checks": [{"kind": "weight_equality"}, {"kind": "sample_accounting"}, {"kind": "throughput", "skip_steps": 1}]}


def test_good(scenario):
    result = scenario(GOOD)
    assert result.passed
    assert result.check("weight_equality").passed


def test_broken(scenario):
    scenario({"name": "broken", "engine_flags": ["--num-rollout", "3"],
              "checks": [{"kind": "learning", "k": 1, "min_last": 5.0}]}).assert_ok()


@pytest.mark.xfail(strict=True, raises=AssertionError, reason="waits for issue 5: fully async")
def test_waits(scenario):
    scenario({"name": "waits", "engine_flags": ["--fake-unsupported=--fully-async"]}).assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("gpu-one")
def test_gpu(scenario):
    scenario({"name": "gpu-one", "profile": "gpu"}).assert_ok()
'''


@pytest.fixture
def suite(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RELAX_HARNESS_MACHINE_CLASS", "cpu: Fake CPU x2")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_scen=TESTS)
    return pytester


def test_options_live_in_their_own_group(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["relax scenario harness:", "*--harness-executor*", "*--harness-profile*",
                                 "*--harness-results*", "*--harness-require-baselines*"])
    assert "--harness-update-baselines" not in result.stdout.str()  # only `relax-harness baseline record` writes


def test_markers_registered_for_strict_markers(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.scenario(name):*", "@pytest.mark.gpu:*", "@pytest.mark.docker:*"])


def test_session_runs_scenarios_and_reports(suite: pytest.Pytester) -> None:
    results = suite.path / "hres"
    result = suite.runpytest_subprocess("--strict-markers", "-rsx", f"--harness-results={results}",
                                        f"--harness-engine-cmd={FAKE}", f"--harness-baselines={suite.path / 'bl'}")
    result.assert_outcomes(passed=1, failed=1, xfailed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*scenario broken*FAILED - check learning: did not learn*",
        "*= relax scenarios =*",
        "*good*no baseline*2/3*no baseline for cpu: Fake CPU x2*",
        "*broken*failed*",
        "*waits*xfailed*",
        "*gpu-one*skipped*gpu scenario: run with --harness-profile gpu*",
        "1 failed, 1 no baseline, 1 skipped, 1 xfailed",
        "results: *results.json  report: *report.html",
        "*XFAIL*test_waits*waits for issue 5*",
    ])
    data = json.loads((results / "results.json").read_text())
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert by_name["good"]["test"]["outcome"] == "passed" and by_name["good"]["status"] == "passed"
    assert by_name["good"]["checks"][2]["status"] == "no_baseline"
    assert by_name["broken"]["test"]["outcome"] == "failed"
    assert by_name["waits"]["status"] == "unsupported"
    assert by_name["waits"]["test"] == {"nodeid": "test_scen.py::test_waits", "outcome": "xfailed",
                                        "reason": "waits for issue 5: fully async"}
    assert by_name["gpu-one"]["status"] == "skipped" and by_name["gpu-one"]["test"]["outcome"] == "skipped"
    html = (results / "report.html").read_text()
    assert "data:image/png;base64," in html and "good" in html


def test_passed_no_baseline_and_skipped_are_three_outcomes_everywhere(suite: pytest.Pytester) -> None:
    """terminal (above), results.json, JUnit properties and the HTML report keep them apart."""
    results = suite.path / "hres"
    suite.runpytest_subprocess(f"--harness-results={results}", f"--harness-engine-cmd={FAKE}",
                               f"--harness-baselines={suite.path / 'bl'}", f"--junitxml={results / 'junit.xml'}")
    import xml.etree.ElementTree as ET

    cases = {c.get("name"): c for c in ET.parse(results / "junit.xml").getroot().iter("testcase")}
    props = {name: {p.get("name"): p.get("value") for p in c.iter("property")} for name, c in cases.items()}
    assert props["test_good"]["relax_outcome"] == "no_baseline"
    assert props["test_good"]["relax_throughput"].startswith("samples_per_s ") and \
        "no baseline for cpu: Fake CPU x2" in props["test_good"]["relax_throughput"]
    assert props["test_gpu"] == {"relax_outcome": "skipped"} and cases["test_gpu"].find("skipped") is not None
    html = (results / "report.html").read_text()
    assert ">no baseline</span>" in html and ">skipped</span>" in html and "1 no baseline, 1 skipped" in html


def test_require_baselines_fails_the_scenario_without_one(suite: pytest.Pytester) -> None:
    args = [f"--harness-results={suite.path / 'r'}", f"--harness-engine-cmd={FAKE}",
            f"--harness-baselines={suite.path / 'bl'}", "-k", "test_good"]
    result = suite.runpytest_subprocess(*args, "--harness-require-baselines")
    result.assert_outcomes(failed=1, deselected=3)
    (good,) = json.loads((suite.path / "r" / "results.json").read_text())["scenarios"]
    assert good["status"] == "failed" and good["message"].startswith("check throughput: samples_per_s ")
    assert good["message"].endswith("no baseline for cpu: Fake CPU x2 (scenario good); record one with "
                                    "`relax-harness baseline record` (--require-baselines)")
    assert not (suite.path / "bl").exists()  # a scenario run never writes a baseline


def test_xdist_workers_results_are_merged(suite: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    results = suite.path / "hres"
    result = suite.runpytest_subprocess("-n", "2", f"--harness-results={results}", f"--harness-engine-cmd={FAKE}",
                                        f"--harness-baselines={suite.path / 'bl'}")
    result.assert_outcomes(passed=1, failed=1, xfailed=1, skipped=1)
    names = {s["name"] for s in json.loads((results / "results.json").read_text())["scenarios"]}
    assert names == {"good", "broken", "waits", "gpu-one"}
    assert not list((results / "partial").glob("*.json"))
