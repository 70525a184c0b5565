"""Plug-in contracts of relax.algorithms (custom loss, pg reducer, TIS) and the DAPO filter."""

from __future__ import annotations

from argparse import Namespace

import pytest
import torch

from relax.algorithms import AlgorithmConfig, extract_reward, policy_loss
from relax.engine.filters.dynamic_sampling_filters import check_reward_nonzero_std
from relax.utils.plugins import PluginError
from relax.utils.types import Sample
from tests.algo_refs import make_args, t

BATCH = dict(
    log_probs=t([[-1.0, -2.0], [-0.5, 0.0]]),
    old_log_probs=t([[-1.1, -2.0], [-0.5, 0.0]]),
    advantages=t([[1.0, 1.0], [-2.0, -2.0]]),
    loss_mask=t([[1.0, 1.0], [1.0, 0.0]]),
    rollout_log_probs=t([[-1.0, -3.0], [-0.5, 0.0]]),
    num_global_samples=2,
    num_global_tokens=3,
)


def _loss(**kw):
    return policy_loss(AlgorithmConfig.from_args(make_args(**kw)), **BATCH)


def test_custom_loss_contract() -> None:
    loss, m = _loss(loss_type="custom_loss", custom_loss_function_path="tests.algo_plugins.reinforce_loss")
    # -A * log p, sample means: row0 = -(-1 - 2) / 2 = 1.5, row1 = -(-2 * -0.5) = -1.0; / 2 samples
    assert float(loss) == pytest.approx((1.5 - 1.0) / 2) and float(m["custom_seen_tokens"]) == pytest.approx(
        1.0
    )


def test_a_loss_hook_of_the_wrong_shape_or_that_raises_is_named() -> None:
    with pytest.raises(PluginError, match=r"^--custom-loss-function-path tests.algo_plugins.float_loss returned "
                                          r"float; expected custom_loss\(args, batch"):
        _loss(loss_type="custom_loss", custom_loss_function_path="tests.algo_plugins.float_loss")
    with pytest.raises(KeyError) as info:
        _loss(loss_type="custom_loss", custom_loss_function_path="tests.algo_plugins.raising_loss")
    assert info.value.__notes__ == ["in --custom-loss-function-path tests.algo_plugins.raising_loss"]
    with pytest.raises(PluginError, match=r"^--custom-tis-function-path tests.algo_plugins.tis_weights_only returned "
                                          r"Tensor; expected tis_function\(.*of the log-probs' shape \(2, 2\)"):
        _loss(use_tis=True, custom_tis_function_path="tests.algo_plugins.tis_weights_only")
    with pytest.raises(PluginError, match=r"^--custom-pg-loss-reducer-function-path tests.algo_plugins.int_reducer "
                                          r"returned int; expected reducer\(.*\) -> Tensor$"):
        _loss(custom_pg_loss_reducer_function_path="tests.algo_plugins.int_reducer")


def test_custom_pg_reducer_contract() -> None:
    _, default = _loss()
    _, custom = _loss(custom_pg_loss_reducer_function_path="tests.algo_plugins.sequence_sum_reducer")
    assert float(custom["pg_loss"]) != pytest.approx(float(default["pg_loss"]))
    assert float(custom["ppo_kl"]) == pytest.approx(
        float(default["ppo_kl"])
    )  # other metrics keep the default


def test_icepop_is_a_custom_tis_function() -> None:
    _, m = _loss(
        use_tis=True, tis_clip=2.0, tis_clip_low=0.5, custom_tis_function_path="relax.algorithms.tis.icepop"
    )
    # ratios exp(old - rollout): row0 = [exp(-0.1), exp(1)] -> e > 2 masked; row1 = [1]
    assert float(m["tis_clipfrac"]) == pytest.approx((0.5 + 0.0) / 2)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (
            {"loss_type": "custom_loss", "custom_loss_function_path": "tests.algo_plugins.missing"},
            r"--custom-loss-function-path: .*has no attribute 'missing'.*custom_loss\(args, batch",
        ),
        (
            {"use_tis": True, "custom_tis_function_path": "tests.algo_plugins.tis_one_arg"},
            r"--custom-tis-function-path: .*takes 1 positional argument.*tis_function\(old_log_probs",
        ),
        (
            {"custom_pg_loss_reducer_function_path": "no_such_module.f"},
            r"--custom-pg-loss-reducer-function-path: cannot import.*reducer\(values",
        ),
    ],
)
def test_bad_plugins_name_flag_path_and_signature(kw: dict, match: str) -> None:
    with pytest.raises(PluginError, match=match):
        _loss(**kw)


def _group(rewards) -> list[Sample]:
    return [Sample(reward=r) for r in rewards]


@pytest.mark.parametrize(
    ("rewards", "key", "keep", "reason"),
    [
        ([1.0, 0.0, 1.0], None, True, None),
        ([1.0, 1.0, 1.0], None, False, "zero_std_1.0"),
        ([0.1, 0.1, 0.1], None, False, "zero_std_0.1"),
        ([{"acc": 0.0, "len": 1}, {"acc": 0.0, "len": 2}], "acc", False, "zero_std_0.0"),
        ([{"acc": 0.0}, {"acc": 1.0}], "acc", True, None),
    ],
)
def test_check_reward_nonzero_std(rewards, key, keep: bool, reason) -> None:
    out = check_reward_nonzero_std(Namespace(reward_key=key), _group(rewards))
    assert (out.keep, out.reason) == (keep, reason)


def test_dict_reward_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="--reward-key 'score' not in reward dict"):
        extract_reward({"acc": 1.0}, "score")
    with pytest.raises(ValueError, match="set --reward-key"):
        check_reward_nonzero_std(Namespace(reward_key=None), _group([{"acc": 1.0}]))
    assert extract_reward({"acc": 1}, "acc") == 1.0 and extract_reward(0.5, None) == 0.5
    assert isinstance(extract_reward(torch.tensor(2.0).item(), None), float)


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), {"acc": float("nan")}])
def test_a_reward_that_is_not_finite_is_refused_where_its_function_is_known(bad) -> None:
    """Past extract_reward a NaN reward is only a non-finite gradient norm, naming no reward function."""
    with pytest.raises(ValueError, match=r"reward is (nan|inf|-inf) \(a reward must be a finite number\)"):
        extract_reward(bad, "acc")
