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


@pytest.fixture(scope="module")
def local_ray(tmp_path_factory):
    from tests.e2e_helpers import in_process_ray

    yield from in_process_ray(tmp_path_factory.mktemp("ray"))


@pytest.mark.ray
def test_an_error_inside_a_ray_actor_is_one_line_and_debug_adds_the_traceback(local_ray: None, capsys) -> None:
    """Hooks like --rollout-data-postprocess-path run in the trainer actor; Ray hands their exception back
    wrapped in its own class with the actor-side traceback as text."""
    import ray

    from relax.entrypoints.train import _report
    from relax.utils.plugins import culprit

    @ray.remote
    class Trainer:  # defined here, so Ray ships it by value
        def train(self) -> None:
            with culprit("--rollout-data-postprocess-path", "my.hooks.postprocess", "rollout 0"):
                {}["advantages_x"]  # noqa: B018 - the hook's bug

    with pytest.raises(Exception) as info:
        ray.get(Trainer.remote().train.remote())
    where = f"tests/test_run_errors.py:{_own_line('the hook')}"
    expected = (f"relax: run failed: in --rollout-data-postprocess-path my.hooks.postprocess (rollout 0): "
                f"KeyError: 'advantages_x' at {where}")
    code, failure, lines = _report(info.value, False, describe)  # main prints them last, after Ray is down
    assert code == 1 and lines == [expected] and capsys.readouterr().err == ""
    assert (failure.type, failure.where) == ("KeyError", where)
    _, _, lines = _report(info.value, True, describe)  # --debug / RELAX_DEBUG=1: the actor's traceback, then the line
    err = "\n".join(lines)
    assert err.startswith("Traceback (most recent call last, in a Ray actor):") and err.splitlines()[-1] == expected


@pytest.mark.ray
def test_an_actor_whose_init_raises_is_one_line_with_the_cause(local_ray: None) -> None:
    """Ray reports it as ActorDiedError with the original traceback as text: the line names the class, the
    exception and where it was raised, never only "ActorDiedError ... creation task"."""
    import ray

    @ray.remote
    class Loader:
        def __init__(self) -> None:
            raise ValueError("model.safetensors: incomplete metadata")  # the cause

        def ready(self) -> bool:
            return True

    with pytest.raises(Exception) as info:
        ray.get(Loader.remote().ready.remote())
    failure = describe(info.value)
    assert type(info.value).__name__ == "ActorDiedError"
    assert failure.message.startswith("in ")
    assert failure.message.endswith(".__init__: ValueError: model.safetensors: incomplete metadata at "
                                    f"tests/test_run_errors.py:{_own_line('# the cause')}"), failure.message
    assert "Loader" in failure.message and "\n" not in failure.message and failure.type == "ValueError"


def test_a_reward_key_typo_names_the_sample_the_function_and_the_keys() -> None:
    from relax.engine.rewards import RewardConfig, compute_rewards
    from relax.engine.rewards.genrm_config import GenRMConfig

    no_genrm = GenRMConfig(genrm_model_path=None, genrm_num_gpus=1, genrm_num_gpus_per_engine=1,
                           genrm_engine_config=None, genrm_sampling_config=None, hook_timeout=300.0)
    cfg = RewardConfig(rm_type="dapo", custom_rm_path=None, group_rm=False, rm_url=None, hook_timeout=300.0,
                       reward_key="scroe", args=Namespace(), genrm=no_genrm)
    with pytest.raises(ValueError) as info:
        asyncio.run(compute_rewards(cfg, [Sample(index=5, group_index=1, response="Answer: 3", label="3")]))
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
    exited = RayActorError(error_msg=(
        "The actor died unexpectedly before finishing this task.\n\tclass_name: TrainerActor\n\tactor_id: abc\n"
        "\tpid: 7\n\tip: 127.0.0.1\nThe actor is dead because its worker process has died. Worker exit type: "
        "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file. "
        "There are some potential root causes. (1) The process is killed by SIGKILL by OOM killer."))
    message = describe(exited).message
    assert "(TrainerActor, pid 7: The actor is dead because its worker process has died. Worker exit type: " \
           "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection error code 2. End of file.)" \
           in message and "potential root causes" not in message and "\n" not in message


def _own_line(text: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if text in line and "def " not in line)
