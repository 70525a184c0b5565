"""--use-streaming-dataset and --custom-prompt-path through ``relax train``: a run of 4 steps and a run of 2 steps,
saved, resumed for 2 more, roll out the same prompts in the same order, each transformed by the hook."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from relax.utils.presets import QUICKSTART
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]

HOOK = "def add_word(prompt, data):\n    return 'max ' + prompt\n"


def _flags(tmp_path: Path) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq


    data = tmp_path / "maxdigit.parquet"
    if not data.exists():
        pq.write_table(pa.Table.from_pylist(read_jsonl(Path(QUICKSTART["prompt_data"]))), data, row_group_size=7)
        (tmp_path / "relax_test_e2e_prompt_hook.py").write_text(HOOK)
    return [*FAST_FLAGS, "--prompt-data", str(data), "--use-streaming-dataset", "--streaming-buffer-size", "16",
            "--custom-prompt-path", "relax_test_e2e_prompt_hook.add_word"]


def _run(tmp_path: Path, name: str, *extra: str) -> None:
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    proc = run_relax([*_flags(tmp_path), "--output-dir", str(tmp_path / name), "--save-debug-rollout-data",
                      str(tmp_path / "rollouts" / name / "{rollout_id}.json"), *extra], tmp_path, env=env)
    assert_ok(proc)


def _prompts(tmp_path: Path, names: list[str]) -> list[list[tuple[int, str]]]:
    steps = []
    for name in names:
        for path in sorted((tmp_path / "rollouts" / name).glob("*.json"), key=lambda p: int(p.stem)):
            groups = json.loads(path.read_text())["groups"]
            steps.append([(g[0]["group_index"], g[0]["prompt"]) for g in groups])
    return steps


def test_streaming_resume_serves_the_same_prompts_and_the_hook_transforms_them(tmp_path: Path) -> None:
    _run(tmp_path, "straight", "--num-rollout", "4")
    _run(tmp_path, "first", "--num-rollout", "2", "--save", str(tmp_path / "ckpt"), "--save-interval", "2")
    _run(tmp_path, "second", "--num-rollout", "4", "--load", str(tmp_path / "ckpt"))
    straight = _prompts(tmp_path, ["straight"])
    assert len(straight) == 4 and all(len(step) == 8 for step in straight)
    assert _prompts(tmp_path, ["first", "second"]) == straight
    drawn = [p for step in straight for p in step]
    assert len({i for i, _ in drawn}) == 32  # one epoch's prompts, none twice
    assert [i for i, _ in drawn] != sorted(i for i, _ in drawn)  # through the seeded shuffle buffer
    assert all(prompt.startswith("max ") and prompt.endswith("=") for _, prompt in drawn)
    records = read_jsonl(Path(QUICKSTART["prompt_data"]))
    assert all(prompt == "max " + records[i]["prompt"] for i, prompt in drawn)
