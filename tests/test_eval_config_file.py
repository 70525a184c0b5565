"""--eval-config FILE (seed 000): the eval sets as a YAML/JSON file, each with its own keys and sampling over the
file's defaults; a bad file is one line per problem naming the file and the key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from relax.engine.rollout.eval_file import load_eval_file
from relax.utils.flag_types import ConfigError
from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax

ADDMOD = str(Path(__file__).parents[1] / "relax" / "models" / "tasks" / "addmod.jsonl")

GOOD = f"""
eval:
  defaults:
    n_samples_per_eval_prompt: 2
    temperature: 0.5
  datasets:
    - name: two
      path: {ADDMOD}
    - name: three
      path: {ADDMOD}
      n_samples_per_eval_prompt: 3
      top_p: 0.9
      max_response_len: 8
"""


def test_datasets_merge_over_the_defaults_from_yaml_and_json(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_text(GOOD)
    import yaml

    (tmp_path / "e.json").write_text(json.dumps(yaml.safe_load(GOOD)))
    for name in ("e.yaml", "e.json"):
        two, three = load_eval_file(str(tmp_path / name))
        assert (two.name, two.n_samples_per_eval_prompt, two.sampling()) == ("two", 2, {"temperature": 0.5})
        assert three.n_samples_per_eval_prompt == 3
        assert three.sampling() == {"temperature": 0.5, "top_p": 0.9, "max_new_tokens": 8}


@pytest.mark.parametrize(("text", "name", "expected"), [
    (None, "missing.yaml", ["missing.yaml: cannot read"]),
    ("eval: [unclosed", "bad.yaml", ["bad.yaml: not YAML"]),
    ("{", "bad.json", ["bad.json: not JSON"]),
    ("eval:\n  datasets:\n    - {name: a, path: p, temprature: 1}\n", "k.yaml",
     ["k.yaml: eval.datasets[0].temprature: Extra inputs are not permitted"]),
    ("eval:\n  defaults: {top_k: many}\n  datasets:\n    - {name: a, path: p, n_samples_per_eval_prompt: 0}\n", "t.yaml",
     ["t.yaml: eval.defaults.top_k:", "t.yaml: eval.datasets[0].n_samples_per_eval_prompt:"]),
    ("eval:\n  datasets: []\n", "e.yaml", ["e.yaml: eval.datasets:"]),
    ("evals: {}\n", "w.yaml", ["w.yaml: eval: Field required", "w.yaml: evals: Extra inputs"]),
])
def test_a_bad_file_is_one_line_per_problem(tmp_path: Path, text: str | None, name: str, expected: list[str]) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_eval_file(str(path))
    lines = info.value.problems
    assert len(lines) == len(expected), lines
    for line, want in zip(lines, expected, strict=True):
        assert line.startswith("--eval-config ") and want in line, lines


@pytest.mark.ray
def test_each_dataset_is_an_eval_set_with_its_own_overrides(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_text(GOOD)
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--eval-interval", "1", "--eval-config", str(tmp_path / "e.yaml"),
                      "--eval-prompt-data", "ignored", "/nowhere.jsonl", "--output-dir", str(run)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (m,) = [m for m in read_jsonl(run / "metrics.jsonl") if m["step"] == 0]
    assert "eval/two/pass@2" in m and "eval/three/pass@3" in m and not any(k.startswith("eval/ignored") for k in m)


@pytest.mark.ray
def test_a_bad_file_fails_the_launch(tmp_path: Path) -> None:
    (tmp_path / "e.yaml").write_text("eval:\n  datasets:\n    - {name: a, path: p, temprature: 1}\n")
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--eval-interval", "1", "--eval-config", str(tmp_path / "e.yaml"),
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("relax:")]
    assert proc.returncode == 2 and len(lines) == 1 and "eval.datasets[0].temprature" in lines[0], proc.stderr[-2000:]
