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

GOOD = {"name": "good", "engine_flags": ["--num-rollout", "3"],
        "checks": [{"kind": "weight_equality"}, {"kind": "sample_accounting"}, {"kind": "throughput"}]}


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
def test_gpu(scenario):
    scenario({"name": "gpu-one", "profile": "gpu"}).assert_ok()
'''


@pytest.fixture
def suite(pytester: pytest.Pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_scen=TESTS)
    return pytester


def test_options_live_in_their_own_group(suite: pytest.Pytester) -> None:
    result = suite.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines(["relax scenario harness:", "*--harness-executor*", "*--harness-profile*",
                                 "*--harness-results*", "*--harness-update-baselines*"])


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
        "*good*passed*3/3*",
        "*broken*failed*",
        "*waits*xfailed*",
        "results: *results.json  report: *report.html",
        "*gpu scenario: run with --harness-profile gpu*",
        "*XFAIL*test_waits*waits for issue 5*",
    ])
    data = json.loads((results / "results.json").read_text())
    by_name = {s["name"]: s for s in data["scenarios"]}
    assert by_name["good"]["test"]["outcome"] == "passed"
    assert by_name["broken"]["test"]["outcome"] == "failed"
    assert by_name["waits"]["status"] == "unsupported"
    assert by_name["waits"]["test"] == {"nodeid": "test_scen.py::test_waits", "outcome": "xfailed",
                                        "reason": "waits for issue 5: fully async"}
    html = (results / "report.html").read_text()
    assert "data:image/png;base64," in html and "good" in html


def test_update_baselines_is_explicit(suite: pytest.Pytester) -> None:
    baselines = suite.path / "bl"
    args = [f"--harness-results={suite.path / 'r'}", f"--harness-engine-cmd={FAKE}",
            f"--harness-baselines={baselines}", "-k", "test_good"]
    suite.runpytest_subprocess(*args).assert_outcomes(passed=1, deselected=3)
    assert not baselines.exists()
    suite.runpytest_subprocess(*args, "--harness-update-baselines").assert_outcomes(passed=1, deselected=3)
    stored = json.loads((baselines / "good.json").read_text())
    assert stored["cpu"]["calibration_s"] > 0
    assert stored["cpu"]["metrics"]["perf/tokens_per_s"]["raw"] == 1000.0


def test_xdist_workers_results_are_merged(suite: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    results = suite.path / "hres"
    result = suite.runpytest_subprocess("-n", "2", f"--harness-results={results}", f"--harness-engine-cmd={FAKE}",
                                        f"--harness-baselines={suite.path / 'bl'}")
    result.assert_outcomes(passed=1, failed=1, xfailed=1, skipped=1)
    names = {s["name"] for s in json.loads((results / "results.json").read_text())["scenarios"]}
    assert names == {"good", "broken", "waits"}
    assert not list((results / "partial").glob("*.json"))
