"""Spec validation, the shipped catalog, and how the scenario files use it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from harness.placeholders import substitute
from harness.profiles import Profile
from harness.spec import ScenarioSpec, load_catalog

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
        # skipped where there is no GPU, and recorded in results.json under the scenario's name
        assert f"pytest.mark.scenario('{name}')" in decorators, f"{node} lacks @pytest.mark.scenario({name!r})"
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
                                                         "min_ratio": 1.0, "decrease": False, "max_drop": None}


@pytest.mark.parametrize("name,jobs", [("cpu.yml", {"tests", "scenarios", "ab"}),
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


# Scenarios that may stay on one-token responses, and why (everything else in these families is multi-token).
ONE_TOKEN = {
    "colocate-learns-cpu": "learning: a random-init tiny model learns only the one-token task by RL quickly",
    "parity-torch-vs-megatron-gpu": "fp32 vs bf16 engines: longer responses would not be the same data",
}
MECHANICS_FAMILIES = ("colocate", "parity", "fully_async", "partial_rollout", "fault_injection")


def _flag(flags: list[str], name: str) -> str | None:
    return flags[flags.index(name) + 1] if name in flags else None


@pytest.mark.parametrize("name", sorted(n for n, s in CATALOG.items() if s.family in MECHANICS_FAMILIES))
def test_mechanics_scenarios_exercise_multi_token_decode(name: str) -> None:
    spec = CATALOG[name]
    for run in spec.runs:
        for flags in run.launches(spec.engine_flags):
            length = int(_flag(flags, "--rollout-max-response-len") or 1)
            if name in ONE_TOKEN:
                assert length == 1, name
                continue
            assert length >= 16 and "--custom-rm-path" in flags, f"{name}/{run.name}: {length}-token responses"
            assert "--rollout-stop-token-ids" not in flags  # they end by EOS or by length
    fails_fast = any(c.kind == "fault_outcome" and c.expect == "failed_fast" for c in spec.checks)
    if name in ONE_TOKEN or fails_fast:
        return
    bounds = [c for c in spec.checks if c.kind == "metric_bound" and c.key == "rollout/response_len_mean"]
    assert bounds and all(c.reduce == "min" and c.op == ">=" and c.value >= 16 for c in bounds), name


def test_engine_hang_outlasts_the_health_check_timeout() -> None:
    spec = CATALOG["fault-engine-hang-cpu"]
    (hang,) = spec.faults
    timeout = float(_flag(spec.runs[0].flags, "--rollout-health-check-timeout"))
    assert hang.duration_s > 2 * timeout
    (outcome,) = [c for c in spec.checks if c.kind == "fault_outcome"]
    assert outcome.min_restarts >= 1


def test_throughput_scenarios_and_spec_digest() -> None:
    timed = sorted(n for n, s in CATALOG.items() if s.measures_throughput)
    assert timed == ["colocate-cpu", "colocate-gpu", "colocate-megatron-gpu"]
    spec = CATALOG["colocate-cpu"]
    assert spec.digest() == ScenarioSpec.model_validate(spec.model_dump(mode="json")).digest()
    assert spec.with_overrides(engine_flags=[*spec.engine_flags, "--lr", "1e-4"]).digest() != spec.digest()
    assert spec.with_overrides(description="other words").digest() == spec.digest()


def test_phase_exits_name_every_phase_but_the_last() -> None:
    from harness.results import RunResult
    from harness.spec import RunSpec

    run = RunSpec(phases=[["--a"], ["--b"]], phase_exits=[143])
    assert run.phase_exit(0) == 143 and RunSpec(phases=[["--a"], ["--b"]]).phase_exit(0) == 0
    with pytest.raises(ValidationError, match="phase_exits names 2 exit codes; the run has 2 phases, so 1"):
        RunSpec(phases=[["--a"], ["--b"]], phase_exits=[143, 0])
    stopped = RunResult(name="main", launches=1, planned_launches=2, phase_exits=[143], phase_exit_codes=[0])
    assert stopped.phase_problem() == "phase 1 of 2 exited 0 (expected 143); the later ones did not run"
    carried_on = RunResult(name="main", launches=2, planned_launches=2, phase_exits=[143], phase_exit_codes=[143, 0])
    assert carried_on.phase_problem() is None
