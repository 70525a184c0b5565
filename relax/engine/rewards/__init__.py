"""Rewards: built-in graders (``--rm-type``) and custom functions (``--custom-rm-path``).

Custom reward functions follow Relax's contract ``reward_func(args, sample, **kwargs)``
returning a float or a dict (then ``--reward-key`` picks the value); sync or async both work.
"""

from __future__ import annotations

import asyncio
import inspect
from argparse import Namespace
from typing import Any

from relax.engine.rewards.graders import GRADERS, RewardFn
from relax.utils.arguments import ConfigError
from relax.utils.plugins import load_function
from relax.utils.types import Sample

CUSTOM_RM_SIGNATURE = "reward_func(args, sample, **kwargs) -> float | dict"


def get_reward_fn(rm_type: str) -> RewardFn:
    try:
        return GRADERS[rm_type]
    except KeyError:
        raise ConfigError(f"unknown --rm-type {rm_type!r}; known: {', '.join(sorted(GRADERS))}") from None


def _reward_fn(args: Namespace) -> Any:
    if args.custom_rm_path:
        return load_function(args.custom_rm_path, flag="--custom-rm-path", signature=CUSTOM_RM_SIGNATURE, min_args=2)
    return get_reward_fn(args.rm_type)


async def _call(fn: Any, args: Namespace, sample: Sample) -> Any:
    result = fn(args, sample)
    return await result if inspect.isawaitable(result) else result


async def compute_rewards(args: Namespace, samples: list[Sample]) -> list[Any]:
    """Score every sample (concurrently for async functions) and store the result on it."""
    fn = _reward_fn(args)
    rewards = await asyncio.gather(*(_call(fn, args, s) for s in samples))
    for s, r in zip(samples, rewards, strict=True):
        s.reward = r
    return list(rewards)
