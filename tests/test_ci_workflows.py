"""The CI workflow templates read only what the nox sessions write (ci/sessions.py), and a scenario session
really writes every one of those paths (run here on the fake engine, as `python -m ci.sessions` runs it)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ci.sessions import SESSIONS, outputs

REPO = Path(__file__).resolve().parents[1]
WORKFLOWS = sorted((REPO / "ci" / "workflows").glob("*.yml"))
PATH = re.compile(r"harness-results/[\w./-]*")


def job_paths(job: dict) -> tuple[set[str], set[str]]:
    """(nox sessions the job runs, harness-results paths it reads or uploads)."""
    sessions, paths = set(), set()
    for step in job["steps"]:
        run = step.get("run", "")
        sessions |= set(re.findall(r"nox -s (\w+)", run))
        paths |= set(PATH.findall(run))
        paths |= set(PATH.findall(str((step.get("with") or {}).get("path", ""))))
    return sessions, paths


@pytest.mark.parametrize("workflow", WORKFLOWS, ids=lambda p: p.name)
def test_workflows_read_only_paths_their_sessions_write(workflow: Path) -> None:
    jobs = yaml.safe_load(workflow.read_text())["jobs"]
    checked = 0
    for name, job in jobs.items():
        sessions, paths = job_paths(job)
        written = [out for s in sessions for out in outputs(s)]
        assert sessions, f"{workflow.name} job {name} runs no nox session"
        for path in paths:
            ok = path in written or (path.endswith("/") and any(w.startswith(path) for w in written))
            assert ok, f"{workflow.name} job {name} reads {path}, which nox -s {'/'.join(sessions)} does not write " \
                       f"(it writes {written})"
            checked += 1
    assert checked


def test_gpu_session_requires_baselines_and_checks_every_throughput(tmp_path: Path) -> None:
    gpu = SESSIONS["gpu_scenarios"]
    assert "--harness-require-baselines" in gpu.pytest_args() and "--require-baselines" in gpu.gate_args()
    assert "--harness-require-baselines" not in SESSIONS["scenarios"].pytest_args()


def test_a_scenario_session_writes_what_it_promises(tmp_path: Path) -> None:
    (tmp_path / "scenarios").mkdir()
    (tmp_path / "scenarios" / "conftest.py").write_text('pytest_plugins = ["harness.pytest_plugin"]\n')
    (tmp_path / "scenarios" / "test_demo.py").write_text(
        "def test_demo(scenario):\n"
        "    scenario({'name': 'demo', 'engine_flags': ['--num-rollout', '4'],\n"
        "              'checks': [{'kind': 'sample_accounting'}, {'kind': 'throughput', 'skip_steps': 1}]}).assert_ok()\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
           "RELAX_HARNESS_MACHINE_CLASS": "cpu: Test CPU x2"}
    proc = subprocess.run([sys.executable, "-m", "ci.sessions", "scenarios", "-p", "no:cacheprovider",
                           f"--harness-engine-cmd={sys.executable} -m harness.fake_engine"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for path in outputs("scenarios"):
        assert (tmp_path / path).is_file(), f"nox -s scenarios promised {path}"
    assert "no baseline" in (tmp_path / "harness-results/cpu/summary.md").read_text()
