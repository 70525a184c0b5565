"""--custom-rollout-log-function-path (seed 000; slime's signature): called once per step with the trained samples,
the step's rollout metrics (what it adds is logged) and the rollout's seconds; True leaves the default rollout
metrics out. A bad path fails the launch, a raising hook the run, each in one line naming it."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]

HOOKS = '''
import json, os

def log_rollout(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    with open(os.path.join(args.output_dir, "hook_calls.jsonl"), "a") as f:
        f.write(json.dumps({"rollout_id": rollout_id, "samples": len(samples), "time": rollout_time,
                            "keys": sorted(rollout_extra_metrics),
                            "rewards": [s.reward for s in samples]}) + "\\n")
    rollout_extra_metrics["rollout/my_metric"] = 40.0 + rollout_id
    return rollout_id == 1  # step 1: the hook logged the rollout itself

def raising(rollout_id, args, samples, rollout_extra_metrics, rollout_time):
    raise RuntimeError("logger down")
'''


@pytest.fixture
def hooks(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "log_hooks.py").write_text(textwrap.dedent(HOOKS))
    return {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}


def test_the_hook_sees_each_step_and_adds_or_replaces_the_rollout_metrics(tmp_path: Path, hooks) -> None:
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--custom-rollout-log-function-path",
                      "log_hooks.log_rollout", "--output-dir", str(run)], tmp_path, env=hooks)
    assert proc.returncode == 0, proc.stderr[-3000:]
    calls = read_jsonl(run / "hook_calls.jsonl")
    assert [c["rollout_id"] for c in calls] == [0, 1]
    assert all(c["samples"] == 32 and c["time"] > 0 and "rollout/reward_mean" in c["keys"] for c in calls)
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["rollout/my_metric"] for m in metrics] == [40.0, 41.0]
    assert metrics[0]["rollout/reward_mean"] == pytest.approx(sum(calls[0]["rewards"]) / 32)
    assert "rollout/reward_mean" not in metrics[1] and "rollout/num_samples" not in metrics[1]
    assert "train/loss" in metrics[1]  # only the rollout's default metrics are left out


def test_a_bad_path_fails_the_launch_and_a_raising_hook_the_run_in_one_line(tmp_path: Path, hooks) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--custom-rollout-log-function-path", "log_hooks.nope",
                      "--output-dir", str(tmp_path / "a")], tmp_path, env=hooks)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("relax:")]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-2000:]
    assert "--custom-rollout-log-function-path" in lines[0] and "has no attribute 'nope'" in lines[0], lines
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--custom-rollout-log-function-path", "log_hooks.raising",
                      "--output-dir", str(tmp_path / "b")], tmp_path, env=hooks)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("relax:")]
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert len(lines) == 1 and "in --custom-rollout-log-function-path log_hooks.raising (rollout 0)" in lines[0], lines
    assert "RuntimeError: logger down" in lines[0], lines
    assert json.loads((tmp_path / "b" / "run.json").read_text())["status"] == "failed"


def test_the_hooks_answer_is_a_bool_or_none_and_what_it_adds_are_numbers() -> None:
    """The contract both log hooks share (merged_metrics); a truthy string or a text metric was taken silently."""
    import numpy as np

    from relax.core.rollout_log_hook import merged_metrics
    from relax.utils.plugins import PluginError

    defaults = {"rollout/reward_mean": 0.5}

    def hook(answer, **added):
        return lambda extra: (extra.update(added), answer)[1]

    name = "--custom-rollout-log-function-path m.log"
    assert merged_metrics(defaults, hook(None, mine=np.float32(2.0)), name) == {"rollout/reward_mean": 0.5,
                                                                                 "mine": 2.0}
    assert merged_metrics(defaults, hook(True, mine=1), name) == {"mine": 1}
    import torch

    assert merged_metrics(defaults, hook(True, mine=torch.tensor(0.25)), name) == {"mine": torch.tensor(0.25)}
    with pytest.raises(PluginError, match="set metric"):  # several elements: no one number to log
        merged_metrics(defaults, hook(True, mine=torch.ones(3)), name)
    assert merged_metrics(defaults, hook(False), name) == defaults
    with pytest.raises(PluginError, match=r"^--custom-rollout-log-function-path m.log returned str; expected a bool "
                                          r"\(True: the hook logged the default metrics itself\) or None$"):
        merged_metrics(defaults, hook("maybe"), name)
    with pytest.raises(PluginError, match=r"^--custom-rollout-log-function-path m.log set metric\(s\) that are not "
                                          r"numbers: mine='not a number'$"):
        merged_metrics(defaults, hook(None, mine="not a number"), name)
