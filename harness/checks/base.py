"""Check contract: a typed params model that evaluates a :class:`CheckContext` into a result."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict

from harness.artifacts import RunArtifacts
from harness.profiles import Precision, Profile, Tolerances, precision_of, tolerances
from harness.registry import Registry


class Status(StrEnum):
    PASSED = "passed"
    FAILED = "failed"
    NO_BASELINE = "no_baseline"  # throughput measured, but this machine class has no baseline: never a pass


class CheckResult(BaseModel):
    kind: str
    name: str
    status: Status
    message: str
    details: dict[str, Any] = {}
    measurements: dict[str, Any] = {}  # numbers worth keeping (baselines, reports)

    @property
    def passed(self) -> bool:
        """Judged and good; a no-baseline check is not a pass (nor a failure)."""
        return self.status is Status.PASSED


@dataclass
class CheckContext:
    """What a check may look at: the runs' artifacts and the job's environment. Nothing else."""

    runs: dict[str, RunArtifacts]
    profile: Profile = Profile.CPU
    baselines_dir: Path | None = None
    baseline_key: str | None = None
    machine_class: str = "cpu: unknown x1"
    require_baselines: bool = False  # a missing throughput baseline fails instead of reporting no_baseline
    spec_digest: str | None = None  # of the scenario's flags: a baseline recorded for other flags does not count
    root: Path = field(default_factory=Path.cwd)  # for relative golden paths

    def precision(self, *names: str | None) -> Precision:
        """The coarsest precision of the named runs (run.json ``dtypes``): what their numbers can agree to."""
        found = [precision_of(self.run(n).run.get("dtypes")) for n in (names or (None,))]
        return Precision.BF16 if Precision.BF16 in found else Precision.FP32

    def tol(self, *names: str | None) -> Tolerances:
        return tolerances(self.precision(*names))

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

    def no_baseline(self, message: str, **extra: Any) -> CheckResult:
        return CheckResult(kind=self.kind, name=self.label, status=Status.NO_BASELINE, message=message, **extra)

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
