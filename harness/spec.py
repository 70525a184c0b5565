"""The scenario spec: typed and validated (pydantic). YAML files in scenarios/specs/ hold them.

A scenario launches one or more runs of ``relax train`` (each optionally in sequential phases,
e.g. train-then-resume in one output dir), injects its faults, then evaluates its checks over
the runs' artifacts. Flags may use placeholders (harness/placeholders.py): ``{output_dir}`` (this run's dir),
``{scenario_dir}``, ``{run:NAME}`` (another run's dir), ``{proxy:NAME}`` (a fault proxy),
``{server:NAME}`` (an engine server the scenario started, kind ``engine_server``) and
``{relax_tasks}`` (the bundled task datasets, relax/models/tasks: prompt files without a preset).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializeAsAny,
    ValidationError,
    field_validator,
    model_validator,
)

from harness.checks import CheckParams, parse_check
from harness.faults import FaultParams, parse_fault
from harness.profiles import Profile

_NAME = r"^[a-z0-9][a-z0-9_.-]*$"


class Resources(BaseModel):
    """What the executor reserves for the run (docker: cpu/memory limits and GPU requests)."""

    model_config = ConfigDict(extra="forbid")
    cpus: float = Field(2.0, gt=0)
    gpus: int = Field(0, ge=0)
    memory_gb: float | None = Field(None, gt=0)


class RunSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field("main", pattern=_NAME)
    flags: list[str] = []  # appended to the scenario's engine_flags
    phases: list[list[str]] = []  # if set: one launch per phase, same output dir, phase flags appended
    env: dict[str, str] = {}
    expect_exit: int | None = 0  # of the last launch; None: any exit code is acceptable (a check judges it)
    # the exit code each phase but the last must end with for the next to start (default 0 for each), e.g. 143
    # for a phase a fault interrupts by SIGTERM before its resume
    phase_exits: list[int] = []

    @model_validator(mode="after")
    def _phase_exits_fit(self) -> RunSpec:
        if self.phase_exits and len(self.phase_exits) != max(len(self.phases) - 1, 0):
            raise ValueError(f"run {self.name}: phase_exits names {len(self.phase_exits)} exit codes; the run has "
                             f"{len(self.phases)} phases, so {max(len(self.phases) - 1, 0)} (all but the last)")
        return self

    def phase_exit(self, index: int) -> int:
        """The exit code phase ``index`` (not the last) must end with."""
        return self.phase_exits[index] if self.phase_exits else 0

    def launches(self, base: list[str]) -> list[list[str]]:
        return [base + self.flags + p for p in self.phases] if self.phases else [base + self.flags]


class ScenarioSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(pattern=_NAME)
    family: str = "misc"
    description: str = ""
    profile: Profile = Profile.CPU
    engine_flags: list[str] = []
    resources: Resources = Resources()
    env: dict[str, str] = {}
    runs: list[RunSpec] = [RunSpec()]
    faults: list[SerializeAsAny[FaultParams]] = []
    checks: list[SerializeAsAny[CheckParams]] = []
    baseline_key: str | None = None
    timeout_s: float = Field(900.0, gt=0)  # per launch
    image: str | None = None  # docker executor; default from the profile

    @field_validator("checks", mode="before")
    @classmethod
    def _checks(cls, value: Any) -> list[CheckParams]:
        return [parse_check(c) for c in value or []]

    @field_validator("faults", mode="before")
    @classmethod
    def _faults(cls, value: Any) -> list[FaultParams]:
        return [parse_fault(f) for f in value or []]

    @model_validator(mode="after")
    def _cross(self) -> ScenarioSpec:
        names = [r.name for r in self.runs]
        if len(set(names)) != len(names):
            raise ValueError(f"run names must be unique: {names}")
        for fault in self.faults:
            if fault.run is not None and fault.run not in names:
                raise ValueError(f"fault {fault.kind} targets unknown run {fault.run!r} (runs: {names})")
        for check in self.checks:
            refs = list(getattr(check, "runs", []) or []) + [getattr(check, "run", None)]
            for ref in refs:
                if ref is not None and ref not in names:
                    raise ValueError(f"check {check.label} references unknown run {ref!r} (runs: {names})")
        if self.profile is Profile.GPU and self.resources.gpus == 0:
            self.resources = self.resources.model_copy(update={"gpus": 1})
        return self

    @property
    def measures_throughput(self) -> bool:
        """Its runs are timed: they get the machine to themselves (`harness.machine_lock`)."""
        return any(c.kind == "throughput" for c in self.checks)

    def digest(self) -> str:
        """A short hash of what the runs execute (flags, phases, env, faults): a throughput baseline recorded
        for other flags is no baseline for these."""
        what = {"engine_flags": self.engine_flags, "env": self.env, "resources": self.resources.model_dump(),
                "runs": [r.model_dump(mode="json") for r in self.runs],
                "faults": [f.model_dump(mode="json") for f in self.faults]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]

    def faults_for(self, run: str) -> list[FaultParams]:
        first = self.runs[0].name
        return [f for f in self.faults if (f.run or first) == run]

    def with_overrides(self, **update: Any) -> ScenarioSpec:
        return ScenarioSpec.model_validate({**self.model_dump(mode="json"), **update})


FILE_KEYS = {"family", "defaults", "scenarios", "anchors"}


def load_file(path: str | Path) -> list[ScenarioSpec]:
    """A YAML file: ``{family: NAME, defaults: {...}, scenarios: [...]}`` or a single scenario mapping.

    ``anchors`` holds YAML anchors the scenarios reuse (shared flags, shared checks); it is not read."""
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{path}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise SpecError(f"{path}: expected a mapping (family, defaults, scenarios), got {type(data).__name__}")
    if "scenarios" not in data:
        return [_validate(data, path)]
    unknown = sorted(set(data) - FILE_KEYS)
    if unknown:
        raise SpecError(f"{path}: unknown top-level keys {unknown} (known: {sorted(FILE_KEYS)})")
    defaults = {"family": data.get("family", path.stem), **(data.get("defaults") or {})}
    if not isinstance(data["scenarios"], list) or not all(isinstance(i, dict) for i in data["scenarios"]):
        raise SpecError(f"{path}: scenarios must be a list of mappings")
    return [_validate({**defaults, **item}, path) for item in data["scenarios"]]


class SpecError(ValueError):
    """A scenario file or specs directory that cannot be read; the message is one line naming the file."""


def _validate(data: dict, path: Path) -> ScenarioSpec:
    try:
        return ScenarioSpec.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'scenario'}: {e['msg']}" for e in exc.errors())
        raise SpecError(f"{path}: scenario {data.get('name', '?')!r}: {problems}") from None


def default_specs_dir() -> Path:
    return Path(__file__).resolve().parents[1] / "scenarios" / "specs"


def load_catalog(directory: str | Path | None = None) -> dict[str, ScenarioSpec]:
    directory = Path(directory) if directory else default_specs_dir()
    if not directory.is_dir():
        raise SpecError(f"{directory}: no such specs directory")
    files = sorted(directory.glob("*.yaml"))
    if not files:
        raise SpecError(f"{directory}: no *.yaml scenario files")
    catalog: dict[str, ScenarioSpec] = {}
    for path in files:
        for spec in load_file(path):
            if spec.name in catalog:
                raise SpecError(f"scenario {spec.name!r} defined twice (again in {path})")
            catalog[spec.name] = spec
    return catalog
