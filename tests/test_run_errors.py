"""A failure during a run ends with one line naming the culprit, no traceback unless --debug / RELAX_DEBUG=1,
and run.json records it (error, error_type, error_where)."""

from __future__ import annotations

import asyncio
import json
import os
from argparse import Namespace
from pathlib import Path

import pytest

from relax.utils.errors import describe
from relax.utils.types import Sample
from tests.e2e_helpers import FAST_FLAGS, run_relax

REPO = Path(__file__).resolve().parents[1]
HOOKS = REPO / "tests" / "recipe_hooks.py"


def _line_of(text: str) -> int:
    return next(i for i, line in enumerate(HOOKS.read_text().splitlines(), 1) if text in line)


def _relax_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("relax:")]


@pytest.fixture
def recipes_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


@pytest.mark.ray
def test_a_raising_reward_function_is_one_line_naming_it(tmp_path: Path, recipes_importable: None) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--custom-rm-path", "tests.recipe_hooks.raising_reward",
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr, proc.stderr
    where = f"tests/recipe_hooks.py:{_line_of('return 1 / 0')}"
    lines = _relax_lines(proc.stderr)
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("relax: run failed: in reward function --custom-rm-path tests.recipe_hooks.raising_reward "
                               "(sample index 3, group "), lines
    assert lines[0].endswith(f"): ZeroDivisionError: division by zero at {where}"), lines
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["status"] == "failed" and info["exit_code"] == 1
    assert info["error_type"] == "ZeroDivisionError" and info["error_where"] == where
    assert info["error"] == lines[0].removeprefix("relax: run failed: ")


@pytest.mark.ray
def test_an_error_inside_a_ray_actor_is_one_line_and_debug_adds_the_traceback(tmp_path: Path, recipes_importable: None,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The rollout-data hook runs in the trainer actor; Ray hands its exception back wrapped."""
    monkeypatch.setenv("RELAX_DEBUG", "1")
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--rollout-data-postprocess-path",
                      "tests.recipe_hooks.raising_postprocess", "--output-dir", str(tmp_path / "run")], tmp_path)
    assert proc.returncode == 1
    where = f"tests/recipe_hooks.py:{_line_of('raise KeyError')}"
    expected = (f"relax: run failed: in --rollout-data-postprocess-path tests.recipe_hooks.raising_postprocess "
                f"(rollout 0): KeyError: 'advantages_x' at {where}")
    assert _relax_lines(proc.stderr)[-1] == expected, proc.stderr
    assert "Traceback" in proc.stderr  # RELAX_DEBUG=1: the full traceback as well
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["error_type"] == "KeyError" and info["error_where"] == where


def test_a_reward_key_typo_names_the_sample_the_function_and_the_keys() -> None:
    from relax.engine.rewards import compute_rewards

    args = Namespace(custom_rm_path=None, rm_type="dapo", group_rm=False, reward_key="scroe")
    with pytest.raises(ValueError) as info:
        asyncio.run(compute_rewards(args, [Sample(index=5, group_index=1, response="Answer: 3", label="3")]))
    failure = describe(info.value)
    assert failure.message.startswith("reward of sample index 5 (group 1) from --rm-type dapo: ValueError: "
                                      "--reward-key 'scroe' not in reward dict (keys: ['acc', 'pred', 'score'])")
    assert failure.type == "ValueError" and failure.where.startswith("relax/algorithms/rewards.py:")


def test_describe_reports_the_innermost_frame_outside_the_library(tmp_path: Path) -> None:
    import json as json_module

    def user_code() -> None:
        json_module.loads("{bad")  # raises inside the standard library

    with pytest.raises(ValueError) as info:
        user_code()
    failure = describe(info.value)
    assert failure.type == "JSONDecodeError"
    assert failure.where == f"tests/test_run_errors.py:{_own_line('json_module.loads')}"
    assert "Traceback" in failure.traceback and "\n" not in failure.message


def test_describe_names_a_dead_actor() -> None:
    from ray.exceptions import RayActorError

    exc = RayActorError(error_msg="The actor died unexpectedly before finishing this task.\n\tclass_name: "
                                  "EngineActor\n\tactor_id: abc\n\tpid: 4242\n\tname: engine")
    assert describe(exc).message.startswith("RayActorError: The actor died unexpectedly before finishing this task. "
                                            "(EngineActor, pid 4242)")


def _own_line(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "def " not in line)
