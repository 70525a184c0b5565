"""ci/bench_overlap.py's figures from two runs' metrics: the largest relative step gap of loss and grad norm, the
median train and step times after the warm-up, and the exit status against --rtol (the GPU runs it exists for are
Megatron on two GPUs; here, the arithmetic on metrics written by hand)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ci.bench_overlap import compare

ROOT = Path(__file__).resolve().parents[1]


def _metrics(losses: list[float], norms: list[float], train: list[float], step: list[float]) -> list[dict]:
    return [{"train/loss": lo, "train/grad_norm": g, "perf/train_time_s": t, "perf/step_time_s": s}
            for lo, g, t, s in zip(losses, norms, train, step, strict=True)]


def test_the_gaps_are_relative_to_the_plain_run_and_the_times_skip_the_warmup() -> None:
    plain = _metrics([1.0, 0.5, -0.2], [2.0, 4.0, 1.0], [9.0, 1.0, 3.0], [20.0, 2.0, 4.0])
    overlap = _metrics([1.0, 0.505, -0.2], [2.0, 4.0, 1.01], [9.0, 0.5, 1.5], [20.0, 1.5, 3.5])
    fig = compare(plain, overlap, warmup=1)
    assert fig["max_rel_gap"]["train/loss"] == pytest.approx(0.01)
    assert fig["max_rel_gap"]["train/grad_norm"] == pytest.approx(0.01)
    assert fig["median_s"] == {"plain": {"train_s": 2.0, "step_s": 3.0}, "overlap": {"train_s": 1.0, "step_s": 2.5}}
    assert fig["ratio_train"] == 0.5 and fig["ratio_step"] == pytest.approx(2.5 / 3.0)
    with pytest.raises(ValueError, match="logged 3 and 2 steps"):
        compare(plain, overlap[:2], warmup=1)
    with pytest.raises(ValueError, match="no step after the first 3"):
        compare(plain, overlap, warmup=3)


@pytest.mark.parametrize(("gap", "rc"), [(0.001, 0), (0.05, 1)])
def test_kept_runs_give_the_json_and_a_gap_over_rtol_fails(tmp_path: Path, gap: float, rc: int) -> None:
    plain = _metrics([1.0] * 4, [1.0] * 4, [2.0] * 4, [3.0] * 4)
    overlap = _metrics([1.0, 1.0, 1.0 + gap, 1.0], [1.0] * 4, [1.0] * 4, [2.0] * 4)
    for name, rows in (("plain", plain), ("overlap", overlap)):
        (tmp_path / f"{name}_metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "overlap.json"
    proc = subprocess.run([sys.executable, "ci/bench_overlap.py", "--events", str(tmp_path), "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == rc, proc.stderr
    saved = json.loads(out.read_text())
    assert saved["ratio_train"] == 0.5 and saved["max_rel_gap"]["train/loss"] == pytest.approx(gap)
    assert saved["provenance"]["commit"] and "--overlap-grad-reduce" in saved["overlap_flags"]
