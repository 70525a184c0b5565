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
