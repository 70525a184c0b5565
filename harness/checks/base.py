"""Check contract: a typed params model that evaluates a :class:`CheckContext` into a result."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from harness.artifacts import RunArtifacts
from harness.profiles import Profile, Tolerances, tolerances
from harness.registry import Registry


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"  # could not be judged (e.g. no baseline yet); the reason says why


class CheckResult(BaseModel):
    kind: str
    name: str
    status: Status
    message: str
    details: dict[str, Any] = {}
    measurements: dict[str, Any] = {}  # numbers worth keeping (baselines, reports)

    @property
    def passed(self) -> bool:
        return self.status is not Status.FAILED


@dataclass
class CheckContext:
    """What a check may look at: the runs' artifacts and the job's environment. Nothing else."""

    runs: dict[str, RunArtifacts]
    profile: Profile = Profile.CPU
    baselines_dir: Path | None = None
    baseline_key: str | None = None
    calibration_s: float | None = None
    device_class: str = "cpu"
    root: Path = field(default_factory=Path.cwd)  # for relative golden paths

    @property
    def tol(self) -> Tolerances:
        return tolerances(self.profile)

    def run(self, name: str | None) -> RunArtifacts:
        if name is None:
            return next(iter(self.runs.values()))
        try:
            return self.runs[name]
        except KeyError:
            raise KeyError(f"no run named {name!r} (runs: {', '.join(self.runs)})") from None


class CheckParams(BaseModel):
    """Base of every check's parameters. Subclasses add typed fields and ``evaluate``."""

    model_config = ConfigDict(extra="forbid")
    kind: str
    name: str | None = None
    kind_name: ClassVar[str] = ""

    @property
    def label(self) -> str:
        return self.name or self.kind

    def evaluate(self, ctx: CheckContext) -> CheckResult:  # pragma: no cover - abstract
        raise NotImplementedError

    def result(self, ok: bool, message: str, **extra: Any) -> CheckResult:
        return CheckResult(kind=self.kind, name=self.label, status=Status.PASSED if ok else Status.FAILED,
                           message=message, **extra)

    def skipped(self, message: str, **extra: Any) -> CheckResult:
        return CheckResult(kind=self.kind, name=self.label, status=Status.SKIPPED, message=message, **extra)

    def run_check(self, ctx: CheckContext) -> CheckResult:
        """``evaluate``, with a crash in the check reported as a failed check rather than an error."""
        try:
            return self.evaluate(ctx)
        except Exception as exc:  # noqa: BLE001 - a check that cannot read its inputs fails, with why
            return self.result(False, f"check could not run: {type(exc).__name__}: {exc}")


CHECKS: Registry[type[CheckParams]] = Registry("check")


def register(kind: str):
    def deco(cls: type[CheckParams]) -> type[CheckParams]:
        cls.kind_name = kind
        CHECKS.add(kind, cls)
        return cls

    return deco


def parse_check(data: Any) -> CheckParams:
    if isinstance(data, CheckParams):
        return data
    if not isinstance(data, dict) or "kind" not in data:
        raise ValueError(f"a check needs a 'kind' (one of {', '.join(CHECKS.names())}); got {data!r}")
    try:
        cls = CHECKS.get(data["kind"])
    except KeyError as exc:
        raise ValueError(exc.args[0]) from None
    return cls.model_validate(data)
