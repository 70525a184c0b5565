"""The conformance suite's server fixture and its JSON report (``RELAX_CONFORMANCE_JSON``: endpoint ->
passed / failed / skipped, each check's outcome and, for a failure, the line that names the differing field)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conformance.target import JSON_ENV, Target, live_target, write_tiny_model

_RESULTS = pytest.StashKey[dict]()
SEED = 0


@pytest.fixture(scope="session")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    live = live_target()
    if live is not None:
        yield live
        return
    from relax.backends.embedded.launch import EngineProcess

    model_dir = write_tiny_model(tmp_path_factory.mktemp("conformance") / "tiny-qwen3")
    proc = EngineProcess.start(["--hf-checkpoint", str(model_dir), "--seed", str(SEED), "--device", "cpu"])
    try:
        yield Target(proc.url, False, model_dir)
    finally:
        proc.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.stash[_RESULTS] = {}


def _reason(report: pytest.TestReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    if crash is not None:
        return crash.message.splitlines()[0][:500]
    if isinstance(report.longrepr, tuple):  # a skip: (file, line, reason)
        return str(report.longrepr[2])
    return str(report.longrepr).splitlines()[-1][:500] if report.longrepr else ""


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = (yield).get_result()
    if report.when != "call" and not (report.failed or report.skipped):
        return
    outcome = "passed" if report.passed else "skipped" if report.skipped else "failed"
    endpoints = list(getattr(getattr(item, "function", None), "conformance_endpoints", ()))
    entry = item.config.stash[_RESULTS].setdefault(item.nodeid, {"outcome": outcome, "endpoints": endpoints})
    if outcome != "passed":
        entry["outcome"], entry["reason"] = outcome, _reason(report)


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get(JSON_ENV)
    if not path:
        return
    checks = session.config.stash[_RESULTS]
    by_endpoint: dict[str, dict] = {}
    rank = {"failed": 2, "passed": 1, "skipped": 0}
    for nodeid, check in sorted(checks.items()):
        for ep in check["endpoints"] or ["(none)"]:
            row = by_endpoint.setdefault(ep, {"status": "skipped", "checks": {}})
            row["checks"][nodeid.split("::", 1)[-1]] = {k: v for k, v in check.items() if k != "endpoints"}
            if rank[check["outcome"]] > rank[row["status"]]:
                row["status"] = check["outcome"]
    server = os.environ.get("RELAX_CONFORMANCE_URL") or "embedded"
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"server": server, "endpoints": dict(sorted(by_endpoint.items()))},
                                     indent=1) + "\n")
