"""Typed config slices (issue 40): outside the driver (relax/core/, relax/entrypoints/) and the flag parsing in
relax/utils/, no function takes the whole ``args`` namespace, except the user-facing hooks whose signatures the
seeds fix. Every other component takes the `FlagSlice` (relax/utils/flag_slice.py) of the flags it reads."""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

from relax.utils.flag_slice import FlagSlice

ROOT = Path(__file__).resolve().parents[1]
# the drivers: relax train's, and relax serve-engine's (its own 20-option parser and namespace, in one file)
DRIVER = ("relax/core/", "relax/entrypoints/", "relax/backends/embedded/server.py")
# relax/utils/debug_modes.py: the --debug-* rules, called by relax/utils/validation.py only
FLAG_PARSING = ("relax/utils/arguments.py", "relax/utils/validation.py", "relax/utils/machine_flags.py",
                "relax/utils/config_files.py", "relax/utils/presets.py", "relax/utils/flag_slice.py",
                "relax/utils/debug_modes.py")
_REWARD = "seed 001: reward_func(args, sample, **kwargs), here a --rm-type grader"
# (file, function) -> where a seed fixes the signature that takes ``args`` (each marked ``# seed hook`` in place)
SEED_HOOKS: dict[tuple[str, str], str] = {
    ("relax/engine/rollout/sglang_rollout.py", "generate_rollout"):
        "seed 000: --rollout-function-path, generate_rollout(args, rollout_id, data_source, evaluation)",
    ("relax/engine/rollout/multi_turn.py", "generate"):
        "seed 001: a custom generate function, generate(args, sample, sampling_params)",
    ("relax/engine/rollout/state.py", "__init__"): "seed 001: GenerateState(args) in a custom generate function",
    ("relax/engine/rollout/data_source.py", "__init__"): "seed 000: --data-source-path, a class built from args",
    ("relax/engine/filters/dynamic_sampling_filters.py", "check_reward_nonzero_std"):
        "seed 000: --dynamic-sampling-filter-path, filter(args, samples, **kwargs)",
    ("relax/engine/rewards/graders.py", "exact"): _REWARD,
    ("relax/engine/rewards/graders.py", "math_answer"): _REWARD,
    ("relax/engine/rewards/reference_graders.py", "math_verl"): _REWARD,
    ("relax/engine/rewards/reference_graders.py", "deepscaler"): _REWARD,
    ("relax/engine/rewards/reference_graders.py", "dapo"): _REWARD,
    ("relax/engine/rewards/remote.py", "remote_rm"): _REWARD,
}


def functions_taking_args() -> list[tuple[str, str, int]]:
    found = []
    for path in sorted((ROOT / "relax").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel.startswith(DRIVER) or rel in FLAG_PARSING:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                params = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
                if any(p.arg == "args" for p in params):
                    found.append((rel, node.name, node.lineno))
    return found


def test_only_the_seed_hooks_take_the_whole_args() -> None:
    extra = [f"{rel}:{line} {name}" for rel, name, line in functions_taking_args() if (rel, name) not in SEED_HOOKS]
    assert extra == [], "take a typed slice instead of args:\n" + "\n".join(extra)


def test_every_listed_hook_still_exists() -> None:
    present = {(rel, name) for rel, name, _ in functions_taking_args()}
    assert sorted(set(SEED_HOOKS) - present) == []


@dataclass(frozen=True)
class _Slice(FlagSlice):
    lr: float
    colocate: bool


def test_a_slice_reads_its_fields_strictly() -> None:
    from argparse import Namespace

    cfg = _Slice.from_args(Namespace(lr=0.1, colocate=None, other=1))
    assert cfg == _Slice(lr=0.1, colocate=False)  # a store_true flag without a schema default arrives as None
    with pytest.raises(ValueError, match="_Slice: args lacks colocate"):
        _Slice.from_args(Namespace(lr=0.1))
