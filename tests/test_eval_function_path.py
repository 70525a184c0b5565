"""--eval-function-path (seed 000): the eval's own generation function, called at each eval step with
``evaluation=True``; its per-set rewards and plain metrics are logged (and handed to the eval log hook)."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from relax.core.eval_function import custom_eval_path, eval_metrics
from relax.utils.plugins import PluginError
from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax

EVAL_FN = '''
import json, os

def my_eval(args, rollout_id, data_source, evaluation=False):
    with open(os.path.join(args.output_dir, "eval_fn_calls.jsonl"), "a") as f:
        f.write(json.dumps({"rollout_id": rollout_id, "evaluation": evaluation}) + "\\n")
    return {"mine": {"rewards": [1.0, 0.0, 0.5 + rollout_id], "samples": []}, "extra_score": 7.0}
'''


def test_builtin_default_means_no_custom_function() -> None:
    assert custom_eval_path(None) is None
    assert custom_eval_path("relax.engine.rollout.sglang_rollout.generate_rollout") is None
    assert custom_eval_path("m.f") == "m.f"


def test_eval_metrics_of_the_returned_data() -> None:
    metrics, data = eval_metrics({"a": {"rewards": [1, 0]}, "eval/x": 2}, "m.f")
    assert metrics == {"eval/a/reward_mean": 0.5, "eval/x": 2.0}
    assert data == {"a": {"samples": [], "rewards": [1.0, 0.0]}}
    with pytest.raises(PluginError, match="--eval-function-path"):
        eval_metrics([1, 2], "m.f")
    with pytest.raises(PluginError, match="'a'"):
        eval_metrics({"a": "nope"}, "m.f")


@pytest.mark.ray
def test_the_custom_eval_function_runs_at_eval_steps(tmp_path: Path) -> None:
    (tmp_path / "my_evals.py").write_text(textwrap.dedent(EVAL_FN))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--eval-interval", "2",
                      "--eval-function-path", "my_evals.my_eval", "--output-dir", str(run)], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = read_jsonl(run / "eval_fn_calls.jsonl")
    assert calls == [{"rollout_id": 0, "evaluation": True}, {"rollout_id": 2, "evaluation": True}]
    metrics = {m["step"]: m for m in read_jsonl(run / "metrics.jsonl")}
    assert metrics[0]["eval/mine/reward_mean"] == pytest.approx(0.5)
    assert metrics[2]["eval/mine/reward_mean"] == pytest.approx(3.5 / 3)
    assert metrics[2]["eval/extra_score"] == 7.0 and "eval/extra_score" not in metrics[1]


@pytest.mark.ray
def test_a_bad_eval_function_path_fails_the_launch_in_one_line(tmp_path: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--eval-interval", "1", "--eval-function-path", "nowhere.nope",
                      "--output-dir", str(tmp_path / "a")], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("relax:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "--eval-function-path" in lines[0], lines
