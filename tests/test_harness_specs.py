"""Spec validation, the shipped catalog, and how the scenario files use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness.profiles import Profile
from harness.spec import ScenarioSpec, load_catalog, substitute

REPO = Path(__file__).resolve().parents[1]
CATALOG = load_catalog(REPO / "scenarios" / "specs")
FAMILIES = ("colocate", "fully_async", "partial_rollout", "opd", "fault_injection", "parity")


def scenario_tests() -> dict[str, tuple[str, set[str]]]:
    """spec name -> (test node, decorator names) from the scenario files' source."""
    found = {}
    for path in (REPO / "scenarios").glob("test_*.py"):
        for node in ast.parse(path.read_text()).body:
            if not isinstance(node, ast.FunctionDef):
                continue
            decorators = {ast.unparse(d) for d in node.decorator_list}
            for call in ast.walk(node):
                if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "scenario" and call.args:
                    found[call.args[0].value] = (f"{path.name}::{node.name}", decorators)
    return found


@pytest.mark.parametrize("name", sorted(CATALOG))
def test_every_shipped_spec_is_valid_and_used(name: str) -> None:
    spec = CATALOG[name]
    assert ScenarioSpec.model_validate(spec.model_dump(mode="json")) == spec  # round-trips
    tests = scenario_tests()
    assert name in tests, f"scenario {name} is in the catalog but no scenarios/test_*.py runs it"
    node, decorators = tests[name]
    if spec.profile is Profile.GPU:
        assert "pytest.mark.gpu" in decorators, f"{node} runs a gpu spec without @pytest.mark.gpu"
        assert spec.resources.gpus >= 1


def test_every_family_has_cpu_and_gpu_variants() -> None:
    for family in FAMILIES:
        profiles = {s.profile for s in CATALOG.values() if s.family == family}
        assert profiles == {Profile.CPU, Profile.GPU}, family


def test_invalid_specs_are_rejected_with_reasons() -> None:
    with pytest.raises(ValidationError, match="unknown check 'bogus'"):
        ScenarioSpec.model_validate({"name": "x", "checks": [{"kind": "bogus"}]})
    with pytest.raises(ValidationError, match="references unknown run 'b'"):
        ScenarioSpec.model_validate({"name": "x", "checks": [{"kind": "loss_parity", "runs": ["main", "b"]}]})
    with pytest.raises(ValidationError, match="Extra inputs are not permitted"):
        ScenarioSpec.model_validate({"name": "x", "checks": [{"kind": "learning", "kk": 1}]})
    with pytest.raises(ValidationError):
        ScenarioSpec.model_validate({"name": "Bad Name"})
    with pytest.raises(ValidationError, match="targets unknown run"):
        ScenarioSpec.model_validate({"name": "x", "faults": [{"kind": "kill", "target_role": "engine:0", "run": "z"}]})
    with pytest.raises(ValidationError):
        ScenarioSpec.model_validate({"name": "x", "profile": "tpu"})


def test_placeholders() -> None:
    values = {"output_dir": "/o", "scenario_dir": "/s", "run:a": "/s/a", "proxy:engine": "127.0.0.1:9"}
    assert substitute(["--save", "{output_dir}/ckpt", "--load={run:a}/ckpt", "{proxy:engine}", "{x}y"], values) == [
        "--save", "/o/ckpt", "--load=/s/a/ckpt", "127.0.0.1:9", "{x}y"]
    with pytest.raises(KeyError, match="unknown placeholder"):
        substitute(["{run:nope}"], values)


def test_gpu_profile_reserves_a_gpu_and_dumps_typed_checks() -> None:
    spec = ScenarioSpec.model_validate({"name": "g", "profile": "gpu", "checks": [{"kind": "learning", "k": 2}]})
    assert spec.resources.gpus == 1
    assert spec.model_dump(mode="json")["checks"][0] == {"kind": "learning", "name": None, "run": None,
                                                         "key": "rollout/reward_mean", "k": 2, "min_last": 0.0,
                                                         "min_ratio": 1.0, "decrease": False}


@pytest.mark.parametrize("name,jobs", [("cpu.yml", {"tests", "scenarios"}),
                                       ("gpu.yml", {"gpu-scenarios", "docker-scenarios"})])
def test_workflows_parse_with_expected_jobs(name: str, jobs: set[str]) -> None:
    data = yaml.safe_load((REPO / "ci" / "workflows" / name).read_text())
    assert set(data["jobs"]) == jobs
    assert True in data or "on" in data  # YAML 1.1 reads the `on:` key as True
    for job in data["jobs"].values():
        assert job["steps"] and all("run" in s or "uses" in s for s in job["steps"])
    if name == "gpu.yml":
        assert "self-hosted" in data["jobs"]["gpu-scenarios"]["runs-on"]
        assert "gpu" in data["jobs"]["gpu-scenarios"]["runs-on"]
    else:
        assert any("ci.gate" in s.get("run", "") for s in data["jobs"]["scenarios"]["steps"])


def test_relax_tasks_placeholder_names_the_bundled_prompt_files() -> None:
    from harness.runner import RELAX_TASKS

    (flag,) = substitute(["{relax_tasks}/maxdigit.jsonl"], {"relax_tasks": str(RELAX_TASKS)})
    assert Path(flag).is_file()
