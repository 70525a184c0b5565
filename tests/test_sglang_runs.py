"""ci/sglang_runs.py on the CPU: the embedded-engine row of the colocate run, summarised from its artifacts (the
SGLang rows need a GPU and SGLang 0.5.14: ci/gpu_session.sh item sglang_runs)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_colocate_run_summarises_weights_mismatch_and_reward(tmp_path: Path) -> None:
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, str(ROOT / "ci/sglang_runs.py"), "colocate", "--engines", "embedded",
                           "--device", "cpu", "--train-backend", "torch", "--model", "tiny-qwen3", "--steps", "3",
                           "--workdir", str(tmp_path), "--json", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["rc"] == 0 and row["steps"] == 3 and row["syncs"] == 4
    assert row["weights"]["status"] == "passed" and row["weights"]["layouts"] == ["relax"]
    assert "4 versions x 1 engine(s)" in row["weights"]["message"]
    assert 0 <= row["train/train_rollout_logprob_abs_diff"]["mean"] < 1e-5
    assert len(row["reward_first_last"]) == 2 and "--check-weight-update-equal" in row["command"]


def test_the_vlm_run_syncs_the_vision_tower_under_checkpoint_names(tmp_path: Path) -> None:
    """Issue 44's run (ci/gpu_session.sh sglang_vlm) on the CPU, its embedded-engine row: tiny-qwen2.5-vl-p14 (the
    geometry SGLang 0.5.14 serves) in bf16, requests with one <|image_pad|> per image, multi-token answers, every
    sync equal under the checkpoint's names (visual.*, model.*: what SGLang's load_weights takes)."""
    out = tmp_path / "runs.json"
    proc = subprocess.run([sys.executable, str(ROOT / "ci/sglang_runs.py"), "vlm", "--engines", "embedded",
                           "--device", "cpu", "--steps", "2", "--workdir", str(tmp_path), "--json", str(out)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "tiny-qwen2.5-vl-p14" and "--bf16" in row["command"] and "--preset vlm-quickstart" in row["command"]
    assert row["rc"] == 0 and row["steps"] == 2 and row["syncs"] == 3
    assert row["weights"]["status"] == "passed", row["weights"]
    assert row["rollout/response_len_mean"]["mean"] > 2
    assert row["train/train_rollout_logprob_abs_diff"]["max"] < 1e-2
    first = json.loads((tmp_path / "vlm_tiny-qwen2.5-vl-p14_embedded" / "weights.jsonl").read_text().splitlines()[0])
    assert {"visual.blocks.0.attn.qkv.weight", "model.layers.1.mlp.up_proj.weight"} <= set(first["checksums"])
    assert not any(name.startswith(("model.visual.", "model.language_model.")) for name in first["checksums"])
