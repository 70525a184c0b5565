"""Result objects (what a scenario test asserts on) and the results JSON file."""

from __future__ import annotations

import json
import math
import platform
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel

from harness.checks import CheckResult, Status
from harness.commit import source_commit

SERIES_KEYS = ("train/loss", "train/grad_norm", "rollout/reward_mean")
SCHEMA = "relax-harness-results/2"


class RunResult(BaseModel):
    name: str
    launches: int = 1
    exit_code: int | None = None
    expect_exit: int | None = 0
    timed_out: bool = False
    duration_s: float = 0.0
    output_dir: str = ""
    log_path: str = ""
    log_tail: str = ""
    unsupported: str | None = None  # the engine's "not supported yet: --flag" line
    faults: list[dict[str, Any]] = []  # fault records the harness injected
    fault_errors: list[str] = []
    killed_pids: list[int] = []
    details: dict[str, Any] = {}
    phase_exit_codes: list[int | None] = []  # one per launch that ran, in order
    phase_exits: list[int] = []  # what each planned launch but the last had to end with (RunSpec.phase_exits)
    planned_launches: int = 1

    def phase_problem(self) -> str | None:
        """A phase before the last that ended with another exit code than its spec says (so the later ones never
        ran); the last phase is `expect_exit`'s."""
        for i, code in enumerate(self.phase_exit_codes):
            if i == self.planned_launches - 1:
                break
            expected = self.phase_exits[i] if self.phase_exits else 0
            if code != expected:
                return f"phase {i + 1} of {self.planned_launches} exited {code} (expected {expected}); the later ones did not run"
        return None


class ScenarioResult(BaseModel):
    name: str
    family: str = "misc"
    profile: str = "cpu"
    executor: str = "local"
    status: Literal["passed", "failed", "unsupported", "skipped"] = "failed"
    message: str = ""
    problems: list[str] = []
    runs: list[RunResult] = []
    checks: list[CheckResult] = []
    baseline_key: str | None = None
    machine_class: str = ""  # what its throughput is comparable within (harness.profiles.machine_class)
    started: float = 0.0
    duration_s: float = 0.0
    series: dict[str, dict[str, list[list[float | None]]]] = {}  # run -> key -> [[step, value], ...]
    test: dict[str, Any] = {}  # pytest node id / outcome / xfail reason (filled by the plugin)

    @property
    def passed(self) -> bool:
        return self.status == "passed"

    def check(self, name: str) -> CheckResult:
        for c in self.checks:
            if name in (c.name, c.kind):
                return c
        raise KeyError(f"no check {name!r} in {self.name} (checks: {[c.name for c in self.checks]})")

    def run(self, name: str = "main") -> RunResult:
        for r in self.runs:
            if r.name == name:
                return r
        raise KeyError(f"no run {name!r} in {self.name}")

    def failures(self) -> list[str]:
        out = list(self.problems)
        out += [f"check {c.name}: {c.message}" for c in self.checks if c.status is Status.FAILED]
        return out

    def no_baseline(self) -> list[CheckResult]:
        return [c for c in self.checks if c.status is Status.NO_BASELINE]

    def pass_message(self) -> str:
        """For a scenario with no failure: how many checks passed, and what could not be judged."""
        missing = self.no_baseline()
        judged = len(self.checks) - len(missing)
        if not missing:
            return f"{judged} checks passed"
        return f"{judged} checks passed; throughput: {missing[0].message}"

    def summary(self) -> str:
        lines = [f"scenario {self.name} [{self.profile}/{self.executor}]: {self.status.upper()} - {self.message}"]
        lines += [f"  {c.status.value:<7} {c.name}: {c.message}" for c in self.checks]
        for r in self.runs:
            if r.exit_code != r.expect_exit and r.expect_exit is not None or r.timed_out:
                lines.append(f"  run {r.name} log ({r.log_path}), last lines:")
                lines += ["    " + ln for ln in r.log_tail.splitlines()[-25:]]
        return "\n".join(lines)

    def assert_ok(self) -> ScenarioResult:
        if not self.passed:
            raise AssertionError(self.summary())
        return self


def clean(value: Any) -> Any:
    """JSON-safe: non-finite floats become None."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def environment() -> dict[str, Any]:
    return {"python": platform.python_version(), "platform": platform.platform(), "host": platform.node(),
            "commit": source_commit() or "unknown", "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


def write_results(path: Path, scenarios: list[ScenarioResult], **meta: Any) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"schema": SCHEMA, "environment": environment(), **meta,
            "scenarios": [clean(s.model_dump(mode="json")) for s in scenarios]}
    path.write_text(json.dumps(data, indent=2, allow_nan=False))
    return path


class ResultsError(ValueError):
    """A results file that cannot be read; the message is one line naming it."""


def load_results(path: Path) -> dict[str, Any]:
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ResultsError(f"{path}: no such results file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise ResultsError(f"{path}: unreadable ({exc})") from None
    except ValueError as exc:
        raise ResultsError(f"{path}: not a results JSON ({exc})") from None
    if not isinstance(data, dict) or not isinstance(data.get("scenarios", []), list):
        raise ResultsError(f"{path}: not a results JSON (expected an object with a scenarios list)")
    return data


def scenario_results(data: dict[str, Any]) -> list[ScenarioResult]:
    return [ScenarioResult.model_validate(s) for s in data.get("scenarios", [])]
