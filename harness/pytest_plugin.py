"""pytest plugin for scenarios: ``pytest_plugins = ["harness.pytest_plugin"]`` in scenarios/conftest.py.

It owns its options (group "relax-harness"), registers its markers, keeps per-test results in a
stash key, gives tests a ``scenario`` fixture (run a spec by name or object, get a
:class:`~harness.results.ScenarioResult` to assert on), and at the end of the session writes
``results.json`` + ``report.html`` to ``--harness-results`` and prints a one-screen summary.
Under pytest-xdist each worker writes a partial file; the controller merges them, and scenarios that
measure throughput take the session's machine lock exclusively (`harness.machine_lock`).

Passed, skipped and no-baseline are three outcomes: a skipped scenario test is recorded in results.json
(status ``skipped`` and the reason), and a passing one whose throughput had no baseline for this machine
class carries JUnit properties ``relax_outcome=no_baseline`` and ``relax_throughput=<why>``.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest

from harness.executors import EXECUTORS, Executor, make_executor
from harness.profiles import Profile, cuda_available, cuda_device_count
from harness.results import ScenarioResult, load_results, write_results
from harness.runner import HarnessConfig, run_scenario
from harness.spec import ScenarioSpec, default_specs_dir, load_catalog

RESULTS_KEY = pytest.StashKey[list[ScenarioResult]]()
SESSION_KEY: pytest.StashKey[HarnessSession] = pytest.StashKey()

MARKERS = (
    "scenario(name): the harness scenario (spec name) this test runs",
    "gpu: needs a CUDA GPU (skipped with a reason otherwise)",
    "multi_gpu: needs two or more CUDA GPUs (skipped with a reason otherwise)",
    "docker: needs a Docker engine",
    "slow: long-running test",
)


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("relax-harness", "relax scenario harness")
    group.addoption("--harness-executor", default="local", choices=EXECUTORS.names(),
                    help="where runs execute: local subprocesses or docker containers (default: local)")
    group.addoption("--harness-profile", default="cpu", choices=[p.value for p in Profile],
                    help="device profile; gpu scenarios are skipped unless 'gpu' and CUDA is present")
    group.addoption("--harness-results", default="harness-results", metavar="DIR",
                    help="where run dirs, results.json and report.html go (default: harness-results)")
    group.addoption("--harness-baselines", default=None, metavar="DIR",
                    help="throughput baselines dir (default: ci/baselines of the repository; written only by "
                         "`relax-harness baseline record`)")
    group.addoption("--harness-require-baselines", action="store_true", default=False,
                    help="a throughput check without a baseline for this machine class fails (default: it "
                         "reports 'no baseline for <class>')")
    group.addoption("--harness-specs", default=None, metavar="DIR",
                    help="scenario spec dir (default: scenarios/specs of the repository)")
    group.addoption("--harness-engine-cmd", default=None, metavar="CMD",
                    help="engine command instead of `python -m relax.cli train` (e.g. a fake engine)")
    group.addoption("--harness-image", default=None, help="docker image (default: relax:<profile>)")


def pytest_configure(config: pytest.Config) -> None:
    for line in MARKERS:
        config.addinivalue_line("markers", line)
    session = HarnessSession(config)
    config.stash[SESSION_KEY] = session
    config.pluginmanager.register(session, "relax-harness-session")


class HarnessSession:
    """Per-session state and the hooks that need it (registered by ``pytest_configure``)."""

    def __init__(self, config: pytest.Config):
        self.config = config
        opt = config.getoption
        self.profile = Profile(opt("--harness-profile"))
        self.results_dir = Path(opt("--harness-results")).resolve()
        root = Path(__file__).resolve().parents[1]
        self.baselines_dir = Path(opt("--harness-baselines") or root / "ci" / "baselines")
        self.specs_dir = Path(opt("--harness-specs") or default_specs_dir())
        self.executor_name = opt("--harness-executor")
        self.engine_cmd = shlex.split(opt("--harness-engine-cmd")) if opt("--harness-engine-cmd") else None
        self.image = opt("--harness-image")
        self.require_baselines = bool(opt("--harness-require-baselines"))
        self.results: list[ScenarioResult] = []
        self._executor: Executor | None = None
        self._cfg: HarnessConfig | None = None
        self._catalog: dict[str, ScenarioSpec] | None = None
        self.worker = getattr(config, "workerinput", {}).get("workerid")

    # -- state -------------------------------------------------------------------------------
    @property
    def catalog(self) -> dict[str, ScenarioSpec]:
        if self._catalog is None:
            self._catalog = load_catalog(self.specs_dir) if self.specs_dir.is_dir() else {}
        return self._catalog

    @property
    def cfg(self) -> HarnessConfig:
        if self._cfg is None:
            kwargs: dict[str, Any] = {"engine_cmd": self.engine_cmd}
            if self.executor_name == "docker":
                kwargs["image"] = self.image
            self._executor = make_executor(self.executor_name, **kwargs)
            self._cfg = HarnessConfig(executor=self._executor, results_dir=self.results_dir,
                                      baselines_dir=self.baselines_dir, require_baselines=self.require_baselines,
                                      lock_dir=self.results_dir)
        return self._cfg

    def resolve(self, spec: str | ScenarioSpec | dict) -> ScenarioSpec:
        if isinstance(spec, ScenarioSpec):
            return spec
        if isinstance(spec, dict):
            return ScenarioSpec.model_validate(spec)
        try:
            return self.catalog[spec]
        except KeyError:
            raise KeyError(f"unknown scenario {spec!r} in {self.specs_dir}; known: {sorted(self.catalog)}") from None

    def skip_reason(self, spec: ScenarioSpec) -> str | None:
        if spec.profile is Profile.GPU:
            if self.profile is not Profile.GPU:
                return f"{spec.name}: gpu scenario; run with --harness-profile gpu"
            if not cuda_available():
                return f"{spec.name}: gpu scenario, but no CUDA device here"
            if cuda_device_count() < spec.resources.gpus:
                return f"{spec.name}: needs {spec.resources.gpus} GPUs, this machine has {cuda_device_count()}"
        if self.executor_name != "local":
            return self.cfg.executor.unavailable(spec.profile)
        return None

    def run(self, item: pytest.Item, spec: str | ScenarioSpec | dict, **overrides: Any) -> ScenarioResult:
        resolved = self.resolve(spec)
        if overrides:
            resolved = resolved.with_overrides(**overrides)
        reason = self.skip_reason(resolved)
        if reason:
            pytest.skip(reason)
        result = run_scenario(resolved, self.cfg)
        result.test = {"nodeid": item.nodeid}
        item.stash.setdefault(RESULTS_KEY, []).append(result)
        self.results.append(result)
        return result

    # -- hooks -------------------------------------------------------------------------------
    def pytest_collection_modifyitems(self, config: pytest.Config, items: list[pytest.Item]) -> None:
        for item in items:
            if item.get_closest_marker("gpu") is None:
                continue
            if self.profile is not Profile.GPU:
                item.add_marker(pytest.mark.skip(reason="gpu scenario: run with --harness-profile gpu"))
            elif not cuda_available():
                item.add_marker(pytest.mark.skip(reason="gpu scenario: no CUDA device on this machine"))
            elif item.get_closest_marker("multi_gpu") is not None and cuda_device_count() < 2:
                item.add_marker(pytest.mark.skip(reason=f"multi-GPU scenario: {cuda_device_count()} CUDA device here"))

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_makereport(self, item: pytest.Item, call: pytest.CallInfo):
        report = yield
        ran = item.stash.get(RESULTS_KEY, [])
        if report.skipped and not ran and report.when in ("setup", "call") and not hasattr(report, "wasxfail"):
            self._record_skip(item, report)
        if report.when == "call":
            for res in ran:
                wasxfail = getattr(report, "wasxfail", None)
                if wasxfail is not None or "[XPASS(strict)]" in str(report.longrepr or ""):
                    marker = item.get_closest_marker("xfail")
                    res.test["reason"] = (marker.kwargs.get("reason") if marker else None) or wasxfail
                    res.test["outcome"] = "xfailed" if report.skipped else "xpassed"
                else:
                    res.test["outcome"] = report.outcome
                if report.passed and res.no_baseline():  # JUnit writes the item's properties at teardown
                    item.user_properties += [("relax_outcome", "no_baseline"),
                                             ("relax_throughput", res.no_baseline()[0].message)]
        return report

    def _record_skip(self, item: pytest.Item, report: pytest.TestReport) -> None:
        """A skipped scenario test still gets a results entry: skipped is not passed."""
        marker = item.get_closest_marker("scenario")
        name = marker.args[0] if marker and marker.args else item.name
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr or "")
        res = ScenarioResult(name=name, status="skipped", message=reason.removeprefix("Skipped: "),
                             test={"nodeid": item.nodeid, "outcome": "skipped", "reason": reason.removeprefix("Skipped: ")})
        if name in self.catalog:
            spec = self.catalog[name]
            res.family, res.profile = spec.family, spec.profile.value
        self.results.append(res)
        item.user_properties.append(("relax_outcome", "skipped"))

    def _merged(self) -> list[dict[str, Any]]:
        mine = [r.model_dump(mode="json") for r in self.results]
        partial_dir = self.results_dir / "partial"
        for path in sorted(partial_dir.glob("*.json")) if partial_dir.is_dir() else []:
            mine += load_results(path).get("scenarios", [])
        return mine

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        meta = {"executor": self.executor_name, "profile": self.profile.value,
                "require_baselines": self.require_baselines}
        if self.worker is not None:
            write_results(self.results_dir / "partial" / f"{self.worker}.json", self.results, **meta)
            return
        scenarios = [ScenarioResult.model_validate(s) for s in self._merged()]
        if not scenarios and not self.results_dir.exists():
            return
        path = write_results(self.results_dir / "results.json", scenarios, **meta)
        from harness.report import write_html

        write_html(json.loads(path.read_text()), self.results_dir / "report.html")
        for p in (self.results_dir / "partial").glob("*.json"):
            p.unlink()

    def pytest_terminal_summary(self, terminalreporter, exitstatus, config) -> None:
        if self.worker is not None:
            return
        path = self.results_dir / "results.json"
        if not path.exists():
            return
        scenarios = load_results(path).get("scenarios", [])
        if not scenarios:
            return
        from harness.report import render_summary

        terminalreporter.write_sep("=", "relax scenarios")
        for line in render_summary(scenarios, width=max(110, min(terminalreporter._tw.fullwidth, 160))).splitlines():
            terminalreporter.write_line(line)
        terminalreporter.write_line(f"results: {path}  report: {self.results_dir / 'report.html'}")


@pytest.fixture
def scenario(request: pytest.FixtureRequest):
    """``scenario("colocate-cpu")`` (or a ScenarioSpec / dict) -> ScenarioResult; kwargs override spec fields."""
    session = request.config.stash[SESSION_KEY]

    def run(spec: str | ScenarioSpec | dict, **overrides: Any) -> ScenarioResult:
        return session.run(request.node, spec, **overrides)

    return run


@pytest.fixture(scope="session")
def harness_session(request: pytest.FixtureRequest) -> HarnessSession:
    return request.config.stash[SESSION_KEY]
