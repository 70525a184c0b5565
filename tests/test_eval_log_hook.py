"""--custom-eval-rollout-log-function-path (seed 000; slime's signature): called after each eval with the per-set
samples and rewards and the eval metrics (what it adds is logged); True leaves the default eval metrics out.
A bad path fails the launch in one line."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]

ADDMOD = str(Path(__file__).parents[1] / "relax" / "models" / "tasks" / "addmod.jsonl")

HOOKS = '''
import json, os

def log_eval(rollout_id, args, data, extra_metrics):
    with open(os.path.join(args.output_dir, "eval_hook_calls.jsonl"), "a") as f:
        f.write(json.dumps({"rollout_id": rollout_id, "keys": sorted(extra_metrics),
                            "sets": {name: {"samples": len(d["samples"]), "rewards": d["rewards"],
                                            "sample_rewards": [s.reward for s in d["samples"]]}
                                     for name, d in data.items()}}) + "\\n")
    extra_metrics["eval/my_metric"] = 10.0 + rollout_id
    return rollout_id == 2  # step 2: the hook logged the eval itself
'''


def test_the_hook_sees_each_eval_and_adds_or_replaces_the_eval_metrics(tmp_path: Path) -> None:
    (tmp_path / "eval_hooks.py").write_text(textwrap.dedent(HOOKS))
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--eval-interval", "2", "--eval-prompt-data", "addmod",
                      ADDMOD, "--n-samples-per-eval-prompt", "2", "--custom-eval-rollout-log-function-path",
                      "eval_hooks.log_eval", "--output-dir", str(run)], tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = read_jsonl(run / "eval_hook_calls.jsonl")
    assert [c["rollout_id"] for c in calls] == [0, 2]
    metrics = {m["step"]: m for m in read_jsonl(run / "metrics.jsonl")}
    for c in calls:
        assert list(c["sets"]) == ["addmod"] and "eval/addmod/reward_mean" in c["keys"]
        s = c["sets"]["addmod"]
        assert s["samples"] == len(s["rewards"]) > 0 and s["rewards"] == pytest.approx(s["sample_rewards"])
    assert metrics[0]["eval/addmod/reward_mean"] == pytest.approx(sum(calls[0]["sets"]["addmod"]["rewards"])
                                                                  / calls[0]["sets"]["addmod"]["samples"])
    assert metrics[0]["eval/my_metric"] == 10.0 and metrics[2]["eval/my_metric"] == 12.0
    assert "eval/addmod/reward_mean" not in metrics[2] and "perf/eval_time_s" in metrics[2]
    assert "eval/my_metric" not in metrics[1]


def test_a_bad_path_fails_the_launch_in_one_line(tmp_path: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--custom-eval-rollout-log-function-path", "nowhere.nope",
                      "--output-dir", str(tmp_path / "a")], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("relax:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "--custom-eval-rollout-log-function-path" in lines[0], lines
