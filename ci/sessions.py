"""What each scenario session runs and where it writes: the one place noxfile.py, ci/gpu_session.sh and the
CI workflow templates take it from (tests/test_ci_workflows.py checks that the templates read only these
paths, and that a session really writes them).

``python -m ci.sessions NAME [pytest args...]`` runs a session's pytest and gate in this Python, for machines
without nox (the GPU machine: ``python3 -m ci.sessions gpu_scenarios``). It exits non-zero if either fails.
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass

RESULTS_ROOT = "harness-results"
TESTS_JUNIT = f"{RESULTS_ROOT}/tests-junit.xml"  # nox -s tests
AB_RESULTS = f"{RESULTS_ROOT}/ab"  # nox -s ab: results.json (with the "ab" record) and report.html
BASELINE_RUNS = f"{RESULTS_ROOT}/baselines"  # nox -s baselines: the recording runs; the baselines go to ci/baselines


@dataclass(frozen=True)
class ScenarioSession:
    """A pytest run of scenarios/ with the harness plugin, then the gate over its results."""

    name: str
    results: str
    selection: tuple[str, ...]
    require_baselines: bool = False

    def pytest_args(self) -> list[str]:
        args = ["scenarios", *self.selection, "--harness-results", self.results, f"--junitxml={self.results}/junit.xml"]
        return args + (["--harness-require-baselines"] if self.require_baselines else [])

    def gate_args(self) -> list[str]:
        args = ["-m", "ci.gate", f"{self.results}/results.json", "--baselines", "ci/baselines",
                "--summary", f"{self.results}/summary.md"]
        return args + (["--require-baselines"] if self.require_baselines else [])

    def outputs(self) -> list[str]:
        return [f"{self.results}/{f}" for f in ("results.json", "report.html", "junit.xml", "summary.md")]


SESSIONS: dict[str, ScenarioSession] = {
    "scenarios": ScenarioSession("scenarios", f"{RESULTS_ROOT}/cpu", ("-n", "2", "--harness-profile", "cpu")),
    # two scenarios at a time on the GPU machine (16 cores, one GPU, tiny models) to fit its 10-minute budget;
    # the ones with a throughput check hold the machine lock exclusively, so they are timed alone
    "gpu_scenarios": ScenarioSession("gpu_scenarios", f"{RESULTS_ROOT}/gpu",
                                     ("-n", "2", "-m", "gpu", "--harness-profile", "gpu"), require_baselines=True),
    "docker_scenarios": ScenarioSession("docker_scenarios", f"{RESULTS_ROOT}/docker",
                                        ("--harness-executor", "docker", "--harness-profile", "cpu")),
}


def outputs(session: str) -> list[str]:
    """Every path (relative to the repository root) the nox session ``session`` writes."""
    if session in SESSIONS:
        return SESSIONS[session].outputs()
    fixed = {"tests": [TESTS_JUNIT], "ab": [f"{AB_RESULTS}/results.json", f"{AB_RESULTS}/report.html"],
             "baselines": [f"{BASELINE_RUNS}/results.json"]}
    return fixed.get(session, [])


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in SESSIONS:
        print(f"usage: python -m ci.sessions {{{','.join(SESSIONS)}}} [pytest args...]", file=sys.stderr)
        return 2
    session, extra = SESSIONS[argv[0]], argv[1:]
    tests = subprocess.run([sys.executable, "-m", "pytest", *session.pytest_args(), *extra]).returncode
    gate = subprocess.run([sys.executable, *session.gate_args()]).returncode
    return tests or gate


if __name__ == "__main__":
    sys.exit(main())
