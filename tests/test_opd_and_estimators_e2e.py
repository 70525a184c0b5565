"""Every advantage estimator runs through the CLI, PPO with its critic; OPD pulls the student
towards a teacher loaded by the training backend (``--opd-type megatron``; torch on CPU) or
served by an engine server (``--opd-type sglang``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]
ESTIMATORS = ["grpo", "gspo", "sapo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import torch

    from relax.models import build_model, load_tokenizer, save_hf

    # Another seed, and logits scaled x8 through the final norm: a peaked teacher, so the student's
    # sampled KL to it starts near 1 nat (two near-uniform random models would sit at ~0 +- noise).
    model = build_model("tiny-qwen3", seed=999)
    with torch.no_grad():
        model.model.norm.weight.mul_(8.0)
    out = tmp_path_factory.mktemp("teacher") / "hf"
    save_hf(model, load_tokenizer("tiny-qwen3"), out)
    return out


@pytest.mark.parametrize("estimator", ESTIMATORS)
def test_estimator_smoke(tmp_path: Path, estimator: str) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--advantage-estimator", estimator,
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert len(metrics) == 2 and all(abs(m["train/loss"]) < 1e3 for m in metrics)
    if estimator == "ppo":
        assert "train/value_loss" in metrics[-1] and "train/critic_grad_norm" in metrics[-1]


OPD_RUNS: dict[str, list[float]] = {}  # teacher type -> train/opd_reverse_kl per step (shared by the tests below)


def _opd_kl(tmp_path: Path, teacher_dir: Path, teacher_flags: list[str], steps: int) -> list[float]:
    tmp_path.mkdir(parents=True, exist_ok=True)  # a subdirectory when the other test's run is not at hand
    proc = run_relax([*FAST_FLAGS, "--num-rollout", str(steps), "--use-opd", *teacher_flags,
                      "--advantage-estimator", "on_policy_distillation", "--entropy-coef", "0",
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    return [m["train/opd_reverse_kl"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")]


@pytest.mark.parametrize("opd_type", ["megatron", "sglang"])
def test_on_policy_distillation_student_approaches_teacher(tmp_path: Path, teacher_dir: Path, opd_type: str) -> None:
    """megatron: the teacher is loaded by the training backend; sglang: an embedded teacher server over
    --opd-teacher-load scores the responses over HTTP."""
    kl = _opd_kl(tmp_path, teacher_dir, ["--opd-type", opd_type, "--opd-teacher-load", str(teacher_dir)], 30)
    OPD_RUNS[opd_type] = kl
    first, last = sum(kl[:5]) / 5, sum(kl[-5:]) / 5
    assert first > 0.5 and last < 0.8 * first, f"KL(student||teacher) did not fall: first {first:.3f}, last {last:.3f}"


def test_opd_sglang_external_teacher_matches_training_backend_teacher(tmp_path: Path, teacher_dir: Path) -> None:
    """--rm-url names a teacher server started outside the run; same seeds and weights give the
    same per-step KL as the training backend's teacher."""
    from relax.backends.embedded.launch import EngineProcess

    server = EngineProcess.start(["--hf-checkpoint", str(teacher_dir), "--dtype", "float32"])
    try:
        kl = _opd_kl(tmp_path, teacher_dir, ["--opd-type", "sglang", "--rm-url", f"{server.url}/generate"], 3)
    finally:
        server.stop()
    reference = OPD_RUNS.get("megatron") or _opd_kl(tmp_path / "ref", teacher_dir, [
        "--opd-type", "megatron", "--opd-teacher-load", str(teacher_dir)], 3)
    assert kl == pytest.approx(reference[:3], abs=1e-4)


def test_opd_shaping_on_grpo_runs(tmp_path: Path, teacher_dir: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--use-opd", "--opd-type", "megatron", "--opd-kl-coef", "0.5",
                      "--opd-teacher-load", str(teacher_dir), "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    assert "train/opd_reverse_kl" in read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]


def test_opd_sglang_dead_teacher_is_one_line_naming_the_url(tmp_path: Path) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--use-opd", "--opd-type", "sglang", "--rm-url", url,
                      "--output-dir", str(tmp_path / "run")], tmp_path, timeout=120)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 1 and last.startswith(f"relax: OPD teacher server {url} is not reachable"), proc.stderr
    assert "Traceback" not in proc.stderr
