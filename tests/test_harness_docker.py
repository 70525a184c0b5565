"""The docker executor against a real Docker engine. Unit tests only detect a running engine
(docker SDK ping) and skip with the reason otherwise; the docker_scenarios nox session is the
place that may start a private dockerd (containers/dockerd.sh)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from harness.executors.docker import DockerExecutor, client_or_reason
from harness.runner import HarnessConfig, run_scenario
from harness.spec import ScenarioSpec

pytestmark = pytest.mark.docker
REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def client():
    client, reason = client_or_reason()
    if reason:
        pytest.skip(reason)
    return client


@pytest.fixture(scope="module")
def image(client) -> str:
    """An image with python3: $RELAX_HARNESS_TEST_IMAGE, relax:cpu or the offline base."""
    for name in filter(None, [os.environ.get("RELAX_HARNESS_TEST_IMAGE"), "relax:cpu", "relax-base:bookworm"]):
        try:
            client.images.get(name)
            return name
        except Exception:  # noqa: BLE001
            continue
    pytest.skip("no image with python3 (build one: containers/build_base.sh or containers/build_images.sh cpu)")


def _executor(client, image: str) -> DockerExecutor:
    # the fake engine is a single stdlib-only file, mounted from the repository
    return DockerExecutor(image=image, client=client, grace_s=2,
                          engine_cmd=["python3", str(REPO / "harness" / "fake_engine.py")], mounts=[REPO / "harness"])


def test_docker_run_host_network_kill_fault_and_removal(client, image: str, tmp_path: Path) -> None:
    spec = ScenarioSpec.model_validate({
        "name": "docker-fake", "engine_flags": ["--num-rollout", "4", "--fake-step-s", "0.4", "--fake-recover"],
        "faults": [{"kind": "kill", "target_role": "engine:0", "at": {"step": 1, "phase": "train"}}],
        "checks": [{"kind": "fault_outcome", "expect": "recovered", "min_restarts": 1},
                   {"kind": "weight_equality"}, {"kind": "sample_accounting"}]})
    res = run_scenario(spec, HarnessConfig(executor=_executor(client, image), results_dir=tmp_path, machine_class="cpu: docker x2"))
    assert res.passed, res.summary()
    details = res.run().details
    assert details["network_mode"] == "host"
    with pytest.raises(Exception, match="(?i)no such container|not found|404"):
        client.containers.get(details["container_id"])
    assert "step_start" in (Path(res.run().output_dir) / "events.jsonl").read_text()


def test_docker_timeout_removes_container(client, image: str, tmp_path: Path) -> None:
    spec = ScenarioSpec.model_validate({"name": "docker-hang", "engine_flags": ["--fake-hang"], "timeout_s": 3})
    t0 = time.monotonic()
    res = run_scenario(spec, HarnessConfig(executor=_executor(client, image), results_dir=tmp_path, machine_class="cpu: docker x2"))
    assert res.run().timed_out and time.monotonic() - t0 < 60
    assert not client.containers.list(all=True, filters={"id": res.run().details["container_id"]})


def test_run_kwargs_host_network_gpu_requests_and_mounts(tmp_path: Path) -> None:
    """Pure: how a launch becomes containers.run() arguments (no engine needed)."""
    pytest.importorskip("docker")
    from harness.executors import Launch
    from harness.profiles import Profile
    from harness.spec import Resources

    launch = Launch(scenario="s", run="main", argv=["--num-rollout", "2"], output_dir=tmp_path / "main",
                    work_dir=tmp_path, log_path=tmp_path / "log", profile=Profile.GPU,
                    resources=Resources(cpus=4, gpus=2, memory_gb=8), env={"RELAX_FAULT_NAN_LOSS_AT_STEP": "1"})
    ex = DockerExecutor(client=object(), mounts=[REPO / "harness"])
    kw = ex.run_kwargs(launch)
    assert kw["network_mode"] == "host" and "ports" not in kw
    assert kw["device_requests"][0]["Count"] == 2 and kw["device_requests"][0]["Capabilities"] == [["gpu"]]
    assert kw["command"][-2:] == ["--output-dir", str(tmp_path / "main")]
    assert kw["volumes"][str(tmp_path.resolve())]["bind"] == str(tmp_path.resolve())
    assert str((REPO / "harness").resolve()) in kw["volumes"]
    assert kw["environment"]["RELAX_FAULT_NAN_LOSS_AT_STEP"] == "1" and kw["nano_cpus"] == 4_000_000_000
    assert kw["mem_limit"] == "8192m" and kw["labels"]["relax-harness"] == "1"
    assert ex.image_for(launch) == "relax:gpu"


def test_docker_runs_a_real_relax_scenario(client, image: str, tmp_path: Path) -> None:
    """The real engine (not the fake) in a container: this interpreter, its environment and the
    repository are bind-mounted read-write at the same paths; host networking only."""
    import sys

    mounts = sorted({REPO, Path(sys.prefix).resolve(), Path(sys.base_prefix).resolve()})
    executor = DockerExecutor(image=image, client=client, grace_s=5, mounts=mounts,
                              engine_cmd=[sys.executable, "-m", "relax.cli", "train"])
    spec = ScenarioSpec.model_validate({
        "name": "docker-colocate", "timeout_s": 300,
        "engine_flags": ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
                         "--global-batch-size", "32", "--micro-batch-size", "16", "--num-rollout", "3"],
        "checks": [{"kind": "weight_equality", "engines": 1, "min_versions": 4}, {"kind": "sample_accounting"},
                   {"kind": "logprob_mismatch"}]})
    res = run_scenario(spec, HarnessConfig(executor=executor, results_dir=tmp_path, machine_class="cpu: docker x2"))
    assert res.passed, res.summary()
    details = res.run().details
    assert details["network_mode"] == "host"
    with pytest.raises(Exception, match="(?i)no such container|not found|404"):
        client.containers.get(details["container_id"])
