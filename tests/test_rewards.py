"""Built-in graders, custom reward functions by dotted path, dict rewards."""

from __future__ import annotations

import asyncio
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from relax.algorithms import extract_reward
from relax.engine.rewards import compute_rewards, get_reward_fn
from relax.engine.rewards.graders import math_answer
from relax.utils.arguments import ConfigError
from relax.utils.types import Sample


def _s(response: str, label: object) -> Sample:
    return Sample(response=response, label=label)


@pytest.mark.parametrize("response, label, expected", [
    ("The answer is \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{1}{2}}", "0.5", 1.0),
    ("so x = 1,000", "1000", 1.0),
    ("first 3 then -7", "-7", 1.0),
    ("\\boxed{{3}}", "\\boxed{3}", 0.0),
    ("\\boxed{3}", "\\boxed{3}", 1.0),
    ("1/2", "0.5", 1.0),
    ("no number here", "1", 0.0),
    ("12", "13", 0.0),
])
def test_math_grader(response: str, label: str, expected: float) -> None:
    assert math_answer(Namespace(), _s(response, label)) == expected


def test_exact_grader_and_unknown_type() -> None:
    assert get_reward_fn("exact")(Namespace(), _s(" 7 ", "7")) == 1.0
    assert get_reward_fn("exact")(Namespace(), _s("8", "7")) == 0.0
    with pytest.raises(ConfigError, match="unknown --rm-type 'nope'; known: exact, math"):
        get_reward_fn("nope")


def test_custom_async_reward_by_dotted_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "my_rm.py").write_text(
        "async def reward(args, sample, **kw):\n    return {'acc': float(sample.response == 'x'), 'len': 1.0}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    args = Namespace(custom_rm_path="my_rm.reward", rm_type=None, reward_key="acc")
    samples = [_s("x", None), _s("y", None)]
    rewards = asyncio.run(compute_rewards(args, samples))
    assert [extract_reward(r, "acc") for r in rewards] == [1.0, 0.0]
    assert samples[0].reward == {"acc": 1.0, "len": 1.0}
    with pytest.raises(ValueError, match="--reward-key 'nope' not in reward dict"):
        extract_reward(rewards[0], "nope")
    with pytest.raises(ValueError, match="set --reward-key"):
        extract_reward(rewards[0], None)
    sys.modules.pop("my_rm", None)


def test_custom_reward_bad_path_names_flag() -> None:
    from relax.utils.plugins import PluginError

    args = Namespace(custom_rm_path="no_such_mod.fn", rm_type=None, reward_key=None)
    with pytest.raises(PluginError, match="--custom-rm-path: cannot import module 'no_such_mod'"):
        asyncio.run(compute_rewards(args, [_s("x", None)]))
