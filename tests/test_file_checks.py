"""Weight and checkpoint files are checked before Ray starts (relax/utils/file_checks.py): one line each,
naming the flag, the file and what is wrong with it."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from relax.checkpoint import LATEST_FILE, iteration_dir
from relax.utils import file_checks
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from relax.utils.presets import QUICKSTART

BASE = ["--preset", "quickstart", "--num-rollout", "1"]


def _weights(path: Path, n: int = 1000) -> int:
    save_file({"a": torch.zeros(n), "b": torch.ones(3, 4)}, str(path))
    return path.stat().st_size


def _truncate(path: Path, size: int) -> None:
    with open(path, "r+b") as f:
        f.truncate(size)


def test_a_complete_safetensors_file_passes_and_each_truncation_is_named(tmp_path: Path) -> None:
    path = tmp_path / "model.safetensors"
    full = _weights(path)
    assert file_checks.safetensors_problem(path) is None
    _truncate(path, full - 1)
    assert file_checks.safetensors_problem(path) == f"model.safetensors is truncated ({full - 1} of {full} bytes)"
    _truncate(path, 20)
    assert "less than its" in file_checks.safetensors_problem(path)
    _truncate(path, 3)
    assert file_checks.safetensors_problem(path).startswith("model.safetensors is truncated (3 bytes")
    path.write_bytes((8).to_bytes(8, "little") + b"not json")
    assert file_checks.safetensors_problem(path) == "model.safetensors is not a safetensors file (its header is not JSON)"


def test_an_hf_directory_lists_every_missing_or_torn_file(tmp_path: Path) -> None:
    full = _weights(tmp_path / "model-00001-of-00002.safetensors")
    _weights(tmp_path / "model-00002-of-00002.safetensors")
    (tmp_path / file_checks.INDEX).write_text(json.dumps({"weight_map": {
        "a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors",
        "c": "model-00003-of-00003.safetensors"}}))
    _truncate(tmp_path / "model-00001-of-00002.safetensors", 1000)
    assert file_checks.hf_dir_problems(tmp_path) == [
        f"{file_checks.INDEX} names model-00003-of-00003.safetensors, which is missing",
        f"model-00001-of-00002.safetensors is truncated (1000 of {full} bytes)"]
    assert file_checks.hf_dir_problems(tmp_path, needs_model=True)[0] == "no config.json"
    tokenizer_only = tmp_path / "tok"  # relax train builds the model from the architecture flags
    tokenizer_only.mkdir()
    assert file_checks.hf_dir_problems(tokenizer_only) == []
    assert file_checks.hf_dir_problems(tokenizer_only, needs_model=True) == ["no config.json",
                                                                             "no *.safetensors weights"]


def test_a_launch_with_a_truncated_hf_checkpoint_fails_in_one_line_before_ray(tmp_path: Path) -> None:
    from relax.models.registry import build_model, load_tokenizer, save_hf

    model_dir = save_hf(build_model("tiny-qwen3", seed=1), load_tokenizer("tiny-qwen3"), tmp_path / "hf")
    parse_args([*BASE, "--hf-checkpoint", str(model_dir)])  # complete: accepted
    weights = model_dir / "model.safetensors"
    full = weights.stat().st_size
    _truncate(weights, full // 2)
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--hf-checkpoint", str(model_dir)])
    assert str(info.value) == f"--hf-checkpoint {model_dir}: model.safetensors is truncated ({full // 2} of {full} bytes)"


def test_load_names_a_missing_or_torn_checkpoint(tmp_path: Path) -> None:
    assert file_checks.checkpoint_problems(tmp_path / "none") == [
        f"checkpoint directory not found: {tmp_path / 'none'}"]
    root = tmp_path / "ckpt"
    step_dir = iteration_dir(root, 3)
    step_dir.mkdir(parents=True)
    (root / LATEST_FILE).write_text("3")
    full = _weights(step_dir / "model.safetensors")
    torch.save({"state": torch.ones(100)}, step_dir / "optimizer.pt")
    (step_dir / "driver_state.pkl").write_bytes(pickle.dumps({"step": 3}))
    assert file_checks.checkpoint_problems(root) == []
    (step_dir / "driver_state.pkl").write_bytes(b"garbage\n")  # unpickled, it failed after Ray's start
    assert file_checks.checkpoint_problems(root) == ["iter_0000003/driver_state.pkl is truncated or not a pickle (8 bytes)"]
    (step_dir / "driver_state.pkl").write_bytes(pickle.dumps({"step": 3})[:-1])
    assert file_checks.checkpoint_problems(root) == ["iter_0000003/driver_state.pkl is truncated or not a pickle (23 bytes)"]
    (step_dir / "driver_state.pkl").write_bytes(pickle.dumps({"step": 3}))
    (root / LATEST_FILE).write_text("abc\n")  # a marker edited by hand
    assert file_checks.checkpoint_problems(root) == [f"{root / LATEST_FILE} holds 'abc', not a step number"]
    (root / LATEST_FILE).write_text("3")
    _truncate(step_dir / "model.safetensors", full - 8)
    opt = (step_dir / "optimizer.pt").stat().st_size
    _truncate(step_dir / "optimizer.pt", opt // 2)
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--load", str(root), "--prompt-data", QUICKSTART["prompt_data"]])
    assert str(info.value).splitlines() == [
        f"--load {root}: iter_0000003/model.safetensors is truncated ({full - 8} of {full} bytes)",
        f"--load {root}: iter_0000003/optimizer.pt is truncated or not a torch checkpoint ({opt // 2} bytes, "
        "no zip directory)"]


def test_save_paths_that_cannot_be_written_are_named_before_the_first_step(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("")
    assert file_checks.writable_dir_problem(tmp_path / "new" / "ckpt") is None  # created by the run, not here
    assert not (tmp_path / "new").exists()
    with pytest.raises(ConfigError) as info:
        parse_args([*BASE, "--save", str(a_file / "ckpt"), "--save-hf", "/proc/sys/relax_hf"])
    lines = str(info.value).splitlines()
    assert lines[0] == f"--save {a_file / 'ckpt'}: cannot write there ({a_file} is a file, not a directory)"
    assert lines[1].startswith("--save-hf /proc/sys/relax_hf: cannot write there (/proc/sys is ")
