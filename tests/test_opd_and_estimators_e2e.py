"""Every advantage estimator runs through the CLI, PPO with its critic; OPD pulls the student
towards a teacher loaded by the training backend (``--opd-type megatron``; torch on CPU)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]
ESTIMATORS = ["grpo", "gspo", "sapo", "cispo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "ppo"]


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from relax.models import build_model, load_tokenizer, save_hf

    out = tmp_path_factory.mktemp("teacher") / "hf"
    save_hf(build_model("tiny-qwen3", seed=999), load_tokenizer("tiny-qwen3"), out)
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


def test_on_policy_distillation_student_approaches_teacher(tmp_path: Path, teacher_dir: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "30", "--use-opd", "--opd-type", "megatron",
                      "--opd-teacher-load", str(teacher_dir), "--advantage-estimator", "on_policy_distillation",
                      "--entropy-coef", "0", "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    kl = [m["train/opd_reverse_kl"] for m in read_jsonl(tmp_path / "run" / "metrics.jsonl")]
    first, last = sum(kl[:5]) / 5, sum(kl[-5:]) / 5
    assert last < 0.8 * first, f"KL(student||teacher) did not fall: first {first:.3f}, last {last:.3f}"


def test_opd_shaping_on_grpo_runs(tmp_path: Path, teacher_dir: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--use-opd", "--opd-type", "megatron", "--opd-kl-coef", "0.5",
                      "--opd-teacher-load", str(teacher_dir), "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    assert "train/opd_reverse_kl" in read_jsonl(tmp_path / "run" / "metrics.jsonl")[-1]


def test_opd_sglang_teacher_is_not_supported_yet(tmp_path: Path, teacher_dir: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--use-opd", "--opd-type", "sglang",
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    assert proc.returncode == 2 and "not supported yet: --opd-type sglang" in proc.stderr
