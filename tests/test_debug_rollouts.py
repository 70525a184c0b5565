"""Replayable rollouts (seed 000's Debug table; relax/core/debug_rollouts.py, relax/utils/debug_modes.py).

The files hold every field training needs, so a replay trains on the same numbers: a run that saves
its rollouts and a ``--load-debug-rollout-data`` replay of them log bitwise the same losses at every
step, and a replay on two data-parallel ranks matches within float summation order. The rules refuse
what a debug mode cannot honour.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from relax.core.debug_rollouts import SavedRollouts, load_rollout, save_rollout
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from relax.utils.types import Sample
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

BASE = ["--preset", "quickstart", "--rollout-batch-size", "2", "--n-samples-per-prompt", "2",
        "--global-batch-size", "4", "--micro-batch-size", "2"]


def _groups(num_groups: int = 2, size: int = 2) -> list[list[Sample]]:
    return [[Sample(index=g * size + i, group_index=g, prompt=[{"role": "user", "content": "1,2="}], label="2",
                    metadata={"k": [1, 2]}, tokens=[3, 4, 5, 6], response="x", response_length=2,
                    loss_mask=[1, 0], rollout_log_probs=[-0.1 * (i + 1), -math.inf], teacher_log_probs=None,
                    status=Sample.Status.TRUNCATED, weight_version=g, token_weight_versions=[g, g], abort_count=1,
                    reward={"score": 1.0 / 3, "acc": i})
             for i in range(size)] for g in range(num_groups)]


def test_a_rollout_reads_back_field_for_field(tmp_path: Path) -> None:
    groups = _groups()
    save_rollout(tmp_path / "sub" / "r0.json", 0, groups)
    assert load_rollout(tmp_path / "sub" / "r0.json") == groups  # floats, -inf, enums, nested values: exact
    record = json.loads((tmp_path / "sub" / "r0.json").read_text())
    assert record["format"] == "relax.debug_rollout" and record["version"] == 1 and record["rollout_id"] == 0
    assert not list((tmp_path / "sub").glob(".*"))  # written atomically, no temporary file left


@pytest.mark.parametrize("content, message", [
    ("{not json", r"not a saved rollout \(Expecting"),
    ('{"format": "other"}', r'not a saved rollout \(no "format": "relax.debug_rollout"\)'),
    ('{"format": "relax.debug_rollout", "version": 9, "groups": []}', r"format version 9; this relax reads 1"),
    ('{"format": "relax.debug_rollout", "version": 1, "groups": [[{"tokenz": [1]}]]}', r"malformed sample \(TypeError"),
])
def test_a_bad_file_is_named(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "r.json"
    path.write_text(content)
    with pytest.raises(ConfigError, match=f"^--load-debug-rollout-data {path}: {message}"):
        load_rollout(path)


def _saved(tmp_path: Path, *flags: str) -> SavedRollouts:
    return SavedRollouts(parse_args([*BASE, "--load-debug-rollout-data", str(tmp_path / "r{rollout_id}.json"),
                                     *flags]))


def test_steps_subsampling_and_batch_checks(tmp_path: Path) -> None:
    for step in range(3):
        save_rollout(tmp_path / f"r{step}.json", step, _groups(num_groups=4))
    saved = _saved(tmp_path)
    assert saved.available() == 3
    assert saved(None, 2, None) == _groups(num_groups=4)
    saved.check_steps(3)
    with pytest.raises(ConfigError, match=r"r3.json does not exist \(rollout 3 of 4\)$"):
        saved.check_steps(4)
    half = _saved(tmp_path, "--load-debug-rollout-data-subsample", "0.5")
    assert half(None, 0, None) == _groups(num_groups=2)  # whole groups from the front
    with pytest.raises(ConfigError, match=r"2 samples \(after --load-debug-rollout-data-subsample 0.25\), not a "
                                          r"multiple of --global-batch-size 4$"):
        _saved(tmp_path, "--load-debug-rollout-data-subsample", "0.25")(None, 0, None)
    with pytest.raises(ConfigError, match=r"group 0 has 2 samples; --n-samples-per-prompt is 4$"):
        _saved(tmp_path, "--n-samples-per-prompt", "4", "--global-batch-size", "8")(None, 0, None)


def test_one_file_for_every_step(tmp_path: Path) -> None:
    save_rollout(tmp_path / "one.json", 0, _groups())
    saved = SavedRollouts(parse_args([*BASE, "--load-debug-rollout-data", str(tmp_path / "one.json")]))
    assert saved.available() == 1 and saved(None, 5, None) == _groups()
    saved.check_steps(10)


@pytest.mark.parametrize("flags, message", [
    (["--debug-train-only"], r"^--debug-train-only needs --load-debug-rollout-data PATH"),
    (["--load-debug-rollout-data-subsample", "0.5"], r"^--load-debug-rollout-data-subsample has no effect without"),
    (["--load-debug-rollout-data", "d.json", "--load-debug-rollout-data-subsample", "1.5"], r"must be in \(0, 1\]"),
    (["--load-debug-rollout-data", "d_{step}.json"], r"only the \{rollout_id\} placeholder is allowed"),
    (["--load-debug-rollout-data", "d.json", "--debug-rollout-only"], r"exclude each other \(--load-debug-"),
    (["--load-debug-rollout-data", "d.json", "--eval-interval", "2", "--eval-prompt-data", "e", "x"],
     r"^--eval-interval has no effect with --debug-train-only \(no rollout runs"),
    (["--load-debug-rollout-data", "d.json", "--save-debug-rollout-data", "e.json"],
     r"^--save-debug-rollout-data has no effect with --debug-train-only"),
    (["--load-debug-rollout-data", "d.json", "--fully-async"], r"^not supported yet: --debug-train-only with "
                                                               r"--fully-async$"),
    (["--load-debug-rollout-data", "d.json", "--offload-train"], r"^--offload-train has no effect with "
                                                                 r"--debug-train-only"),
    (["--debug-rollout-only", "--save", "ckpt"], r"^--save has no effect with --debug-rollout-only \(no trainer"),
    (["--debug-rollout-only", "--check-weight-update-equal"], r"^--check-weight-update-equal has no effect"),
])
def test_what_a_debug_mode_cannot_honour(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_debug_modes_turn_colocate_offload_off() -> None:
    for mode in (["--load-debug-rollout-data", "d.json"], ["--debug-rollout-only"]):
        args = parse_args([*BASE, *mode])  # the quickstart preset's --colocate
        assert args.colocate and not args.offload_train and not args.offload_rollout


# half the answers score 1: every group has a reward spread, so the policy-gradient terms are not zero
REWARD = "def reward_func(args, sample, **kwargs):\n    return float(sample.tokens[-1] % 2)\n"


@pytest.mark.slow
def test_a_saved_rollout_trains_the_same_under_two_layouts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Save while training; replay on one rank (bitwise the original run) and on two ranks (float order).

    ``--use-rollout-logprobs`` makes the saved log-probs the PPO ratio's denominator and the custom reward
    the advantages' source, so a field lost on the way would change the losses."""
    (tmp_path / "parity_reward.py").write_text(REWARD)
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    data = str(tmp_path / "rollouts" / "step{rollout_id}.json")
    original, dp1, dp2 = tmp_path / "original", tmp_path / "dp1", tmp_path / "dp2"
    common = [*FAST_FLAGS, "--num-rollout", "3", "--use-rollout-logprobs"]
    assert_ok(run_relax([*common, "--custom-rm-path", "parity_reward.reward_func", "--save-debug-rollout-data", data,
                         "--output-dir", str(original)], tmp_path))
    assert sorted(p.name for p in (tmp_path / "rollouts").iterdir()) == [f"step{k}.json" for k in range(3)]
    for out, actor in ((dp1, "[1, 0]"), (dp2, "[2, 0]")):
        assert_ok(run_relax([*common, "--load-debug-rollout-data", data, "--resource", f'{{"actor": {actor}}}',
                             "--output-dir", str(out)], tmp_path))
        roles = {e["role"] for e in read_jsonl(out / "events.jsonl") if e["event"] == "process_started"}
        assert roles == ({"trainer:0"} if out is dp1 else {"trainer:0", "trainer:1"})  # no engine started
        assert read_jsonl(out / "weights.jsonl") == []  # nothing to sync to
    runs = {name: read_jsonl(path / "metrics.jsonl") for name, path in
            (("original", original), ("dp1", dp1), ("dp2", dp2))}
    assert [m["step"] for m in runs["dp2"]] == [0, 1, 2]
    keys = ("train/loss", "train/pg_loss", "train/grad_norm", "train/entropy", "train/ppo_kl",
            "train/train_rollout_logprob_abs_diff", "rollout/reward_mean")
    # rewards spread in every step: the policy gradient (not only the entropy bonus, ~0.002) drives the update
    assert all(0 < m["rollout/reward_mean"] < 1 and m["train/grad_norm"] > 0.1 for m in runs["original"])
    for step in range(3):
        for key in keys:
            assert runs["dp1"][step][key] == runs["original"][step][key], (step, key)
            assert runs["dp2"][step][key] == pytest.approx(runs["dp1"][step][key], rel=1e-5, abs=1e-7), (step, key)


@pytest.mark.slow
def test_rollout_only_runs_no_trainer(tmp_path: Path) -> None:
    out, data = tmp_path / "run", tmp_path / "r{rollout_id}.json"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "2", "--debug-rollout-only", "--save-debug-rollout-data",
                         str(data), "--output-dir", str(out)], tmp_path))
    roles = {e["role"] for e in read_jsonl(out / "events.jsonl") if e["event"] == "process_started"}
    assert roles == {"engine:0"} and read_jsonl(out / "weights.jsonl") == []
    groups = [load_rollout(tmp_path / f"r{k}.json") for k in range(2)]
    samples = [s for g in groups for group in g for s in group]
    assert len(samples) == 2 * 8 * 4 and {s.weight_version for s in samples} == {0}  # the --hf-checkpoint weights
    assert all(s.rollout_log_probs and len(s.rollout_log_probs) == s.response_length for s in samples)
    metrics = read_jsonl(out / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1] and not any(k.startswith("train/") for m in metrics for k in m)
