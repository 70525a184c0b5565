"""The buffer filter, the train-data converter and the rollout-data post-process hook: each is
called with Relax's arguments, its output is what the run uses, and a wrong answer is refused with
a one-line PluginError naming the flag."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch.batch import TrainSample, build_rollout_tensors
from relax.backends.torch.rollout_postprocess import postprocess_rollout_data
from relax.core.train_data import to_train_samples
from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
from relax.models import load_tokenizer
from relax.utils.arguments import parse_args
from relax.utils.plugins import PluginError, load_object
from relax.utils.types import Sample

HOOKS = '''
CALLS = []

def newest_first(args, rollout_id, buffer, num_samples):
    CALLS.append((rollout_id, len(buffer), num_samples))
    return list(reversed(buffer))[:num_samples]

def pop_first(args, rollout_id, buffer, num_samples):  # Relax's default: pops from the list it gets
    taken = buffer[:num_samples]
    del buffer[:num_samples]
    return taken

def foreign(args, rollout_id, buffer, num_samples):
    return [list(buffer[0])]

def not_a_list(args, rollout_id, buffer, num_samples):
    return None

def convert(args, samples):
    CALLS.append(len(samples))
    return {"tokens": [s.tokens for s in samples], "response_lengths": [s.response_length for s in samples],
            "rewards": [10.0 + i for i in range(len(samples))], "raw_reward": [0.5] * len(samples),
            "loss_masks": [[0] + [1] * (s.response_length - 1) for s in samples]}

def convert_list(args, samples):
    return [1, 2, 3]

def convert_short(args, samples):
    out = convert(args, samples)
    out["rewards"] = out["rewards"][:-1]
    return out

def zero_first_token(args, rollout_id, rollout_data):
    CALLS.append((rollout_id, sorted(rollout_data)))
    rollout_data["loss_masks"][:, 0] = 0

def replace_advantages(args, rollout_id, rollout_data):
    return {**rollout_data, "advantages": torch.full_like(rollout_data["advantages"], 7.0)}

def returns_list(args, rollout_id, rollout_data):
    return []

def post_none(args, samples):
    return None

def post_short(args, samples):
    return [0.0] * len(samples), [0.0]

def keep_text(args, samples, **kwargs):
    return "yes"

class HalfSource:  # a --data-source-path class without get_samples / state_dict
    def __init__(self, args):
        self.args = args

    def add_samples(self, groups):
        pass

    def load_state_dict(self, state):
        pass

import torch
'''


@pytest.fixture()
def hooks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    name = f"relax_test_hooks_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(HOOKS))
    monkeypatch.syspath_prepend(str(tmp_path))
    yield name
    sys.modules.pop(name, None)
    load_object.cache_clear()


def _source(tmp_path: Path, hook: str | None) -> RolloutDataSourceWithBuffer:
    data = tmp_path / "d.jsonl"
    data.write_text("".join(f'{{"prompt": "{i}+1=", "label": "{(i + 1) % 10}"}}\n' for i in range(8)))
    flags = ["--preset", "quickstart", "--prompt-data", str(data), "--n-samples-per-prompt", "2"]
    args = parse_args(flags + (["--buffer-filter-path", hook] if hook else []))
    return RolloutDataSourceWithBuffer(args, tokenizer=load_tokenizer("tiny-qwen3"))


@pytest.mark.parametrize("fn", ["newest_first", "pop_first"])
def test_buffer_filter_picks_the_groups_served_next(tmp_path: Path, hooks: str, fn: str) -> None:
    src = _source(tmp_path, f"{hooks}.{fn}")
    groups = src.get_samples(4)
    src.add_samples(groups)
    taken = src.get_samples(3)
    expected = [groups[3], groups[2], groups[1]] if fn == "newest_first" else groups[:3]
    assert taken == expected and all(a is b for a, b in zip(taken, expected, strict=True))
    assert src.buffer == [g for g in groups if all(g is not t for t in taken)], "the rest stays buffered"
    if fn == "newest_first":
        assert sys.modules[hooks].CALLS == [(None, 4, 3)]
    left = src.get_samples(1)[0]
    assert left is (groups[0] if fn == "newest_first" else groups[3]) and not src.buffer, "none lost or served twice"


@pytest.mark.parametrize("fn", ["foreign", "not_a_list"])
def test_buffer_filter_returning_other_groups_is_refused(tmp_path: Path, hooks: str, fn: str) -> None:
    src = _source(tmp_path, f"{hooks}.{fn}")
    src.add_samples(src.get_samples(2))
    with pytest.raises(PluginError, match="--buffer-filter-path must return groups taken from the buffer"):
        src.get_samples(2)


def test_buffer_filter_that_does_not_exist_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(PluginError, match="--buffer-filter-path: cannot import module 'no_such_mod'"):
        _source(tmp_path, "no_such_mod.fn")


def _samples(n: int = 4) -> list[list[Sample]]:
    return [[Sample(index=i, tokens=[5, 6, 7, 8 + i], response_length=2, reward=float(i % 2),
                    rollout_log_probs=[-0.1, -0.2]) for i in range(n)]]


def _train_args(**kw):
    base = dict(custom_convert_samples_to_train_data_path=None, custom_reward_post_process_path=None, reward_key=None,
                use_opd=False, opd_type=None)
    return SimpleNamespace(**{**base, **kw})


def test_convert_hook_output_is_what_trains(hooks: str) -> None:
    train, raw = to_train_samples(_train_args(custom_convert_samples_to_train_data_path=f"{hooks}.convert"), _samples())
    assert sys.modules[hooks].CALLS == [4]
    assert [t.reward for t in train] == [10.0, 11.0, 12.0, 13.0] and raw == [0.5] * 4
    assert all(t.loss_mask == [0, 1] for t in train) and train[3].tokens == [5, 6, 7, 11]
    assert all(t.rollout_log_probs is None for t in train), "only the columns the hook returns"


@pytest.mark.parametrize(("fn", "message"), [("convert_list", "returned list; expected convert_samples_to_train_data"),
                                             ("convert_short", "'rewards' has 3 entries for 4 samples")])
def test_convert_hook_wrong_answer_is_refused(hooks: str, fn: str, message: str) -> None:
    with pytest.raises(PluginError, match=message) as info:
        to_train_samples(_train_args(custom_convert_samples_to_train_data_path=f"{hooks}.{fn}"), _samples())
    assert "--custom-convert-samples-to-train-data-path" in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("fn", "message"), [
    ("post_none", "returned NoneType; expected post_process(args, samples: list[Sample]) -> (raw_rewards, rewards)"),
    ("post_short", "returned 4 raw rewards and 1 rewards for 4 samples"),
])
def test_reward_post_process_wrong_answer_is_refused(hooks: str, fn: str, message: str) -> None:
    with pytest.raises(PluginError) as info:
        to_train_samples(_train_args(custom_reward_post_process_path=f"{hooks}.{fn}"), _samples())
    assert str(info.value) == f"--custom-reward-post-process-path {hooks}.{fn} {message}"


def test_a_dynamic_filter_answer_that_is_no_verdict_is_refused(hooks: str) -> None:
    from relax.engine.rollout.state import dynamic_filter

    keep = dynamic_filter(SimpleNamespace(dynamic_sampling_filter_path=f"{hooks}.keep_text", args=None))
    with pytest.raises(PluginError) as info:
        keep(_samples()[0])
    assert str(info.value) == (f"--dynamic-sampling-filter-path {hooks}.keep_text returned str; expected filter(args, "
                               "samples: list[Sample], **kwargs) -> DynamicFilterOutput | bool")


@pytest.mark.parametrize("num_rollout", [3, None])
def test_a_data_source_without_the_methods_the_run_calls_is_refused_at_launch(hooks: str, num_rollout) -> None:
    from relax.core.setup import _data_source

    args = parse_args(["--preset", "quickstart", "--data-source-path", f"{hooks}.HalfSource"])
    args.num_rollout = num_rollout  # unset: the epoch count needs num_rollout_for_epochs too
    with pytest.raises(PluginError) as info:
        _data_source(args, load_tokenizer("tiny-qwen3"))
    needed = "get_samples, add_samples, state_dict, load_state_dict" + (", num_rollout_for_epochs" if num_rollout
                                                                          is None else "")
    missing = "get_samples, state_dict" + (", num_rollout_for_epochs" if num_rollout is None else "")
    assert str(info.value) == (f"--data-source-path {hooks}.HalfSource: the object it builds has no {missing} "
                               f"(a data source is built as cls(args) and needs {needed})")


def _batch():
    samples = [TrainSample(tokens=[1, 2, 3, 4], response_length=2, loss_mask=[1, 1], reward=1.0),
               TrainSample(tokens=[1, 2, 3, 4, 5], response_length=3, loss_mask=[1, 1, 1], reward=0.0)]
    batch = build_rollout_tensors(samples)
    adv = SimpleNamespace(advantages=torch.ones_like(batch.loss_mask), returns=None)
    return batch, adv


def _hook_config(path: str) -> TrainerConfig:
    """The trainer's slice of the default flags, with ``--rollout-data-postprocess-path`` set to ``path``."""
    flags = ["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]
    return TrainerConfig.from_args(parse_args(flags)).replace(rollout_data_postprocess_path=path)


def test_postprocess_hook_edits_the_loss_mask_the_trainer_uses(hooks: str) -> None:
    batch, adv = _batch()
    cfg = _hook_config(f"{hooks}.zero_first_token")
    postprocess_rollout_data(cfg, 3, batch, torch.zeros_like(batch.loss_mask), None, adv)
    assert batch.loss_mask.tolist() == [[0, 1, 0], [0, 1, 1]]
    rollout_id, keys = sys.modules[hooks].CALLS[0]
    assert rollout_id == 3 and {"loss_masks", "log_probs", "advantages", "rewards", "tokens"} <= set(keys)


def test_postprocess_hook_may_return_replacements(hooks: str) -> None:
    batch, adv = _batch()
    cfg = _hook_config(f"{hooks}.replace_advantages")
    postprocess_rollout_data(cfg, 0, batch, torch.zeros_like(batch.loss_mask), None, adv)
    assert bool((adv.advantages == 7.0).all())


def test_postprocess_hook_wrong_answer_is_refused(hooks: str) -> None:
    batch, adv = _batch()
    cfg = _hook_config(f"{hooks}.returns_list")
    with pytest.raises(PluginError, match="--rollout-data-postprocess-path returned list; expected"):
        postprocess_rollout_data(cfg, 0, batch, torch.zeros_like(batch.loss_mask), None, adv)


def test_a_rollout_function_answering_other_than_groups_of_samples_is_refused() -> None:
    from relax.core.setup import CheckedRollout

    good = [[Sample(index=0)], [Sample(index=1)]]
    assert CheckedRollout(lambda a, r, d: good, "m.roll")(None, 0, None) is good
    with pytest.raises(PluginError) as info:
        CheckedRollout(lambda a, r, d: [1, 2, 3], "m.roll")(None, 0, None)
    assert str(info.value) == ("--rollout-function-path m.roll returned a list holding int; expected "
                               "generate_rollout(args, rollout_id, data_source, evaluation=False) -> list[list[Sample]]")
    with pytest.raises(PluginError, match="^--rollout-function-path m.roll returned dict; expected"):
        CheckedRollout(lambda a, r, d: {}, "m.roll")(None, 0, None)

    def broken(args, rollout_id, data_source):
        raise KeyError("prompt")

    with pytest.raises(KeyError) as raised:
        CheckedRollout(broken, "m.broken")(None, 3, None)
    assert raised.value.__notes__ == ["in --rollout-function-path m.broken (rollout 3)"]
