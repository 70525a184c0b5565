"""Rewards: built-in graders (``--rm-type``) and custom functions (``--custom-rm-path``).

Custom reward functions follow Relax's contract ``reward_func(args, sample, **kwargs)``
returning a float or a dict (then ``--reward-key`` picks the value); sync or async both work.

`compute_rewards` takes the run's `RewardConfig` slice and resolves one *scorer*: a coroutine that
takes the samples and returns one raw reward per sample. Per-sample functions (built-in graders, custom rm) are
wrapped by `_per_sample`; group rewards (``--group-rm``) and the remote rm slot in as other
scorers without touching the callers.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from relax.engine.rewards.config import RewardConfig
from relax.engine.rewards.graders import GRADERS, RewardFn
from relax.utils.flag_types import ConfigError
from relax.utils.gather import gather_or_cancel
from relax.utils.plugins import HookTimeout, bounded, load_function
from relax.utils.types import Sample

CUSTOM_RM_SIGNATURE = "reward_func(args, sample, **kwargs) -> float | dict"

Scorer = Callable[[list[Sample]], Awaitable[list[Any]]]

__all__ = ["CUSTOM_RM_SIGNATURE", "GRADERS", "RewardConfig", "RewardFn", "compute_rewards", "get_reward_fn"]


def get_reward_fn(rm_type: str) -> RewardFn:
    """The built-in grader registered as ``rm_type``."""
    try:
        return GRADERS[rm_type]
    except KeyError:
        raise ConfigError(f"unknown --rm-type {rm_type!r}; known: {', '.join(sorted(GRADERS))}") from None


def _per_sample(fn: Callable[..., Any], name: str, hook_args: Any, timeout_s: float | None = None) -> Scorer:
    """Score samples one call each, as ``fn(hook_args, sample)``; async functions run concurrently. ``timeout_s``: a
    user function's bound per call (``--hook-timeout``; built-in graders have none)."""

    async def call(sample: Sample, serial: asyncio.Lock) -> Any:
        try:
            if timeout_s is not None:
                flag, path = name.split(" ", 1)
                return await bounded(flag, path, timeout_s, fn, hook_args, sample, serial=serial,
                                     detail=f"sample index {sample.index}, group {sample.group_index}")
            result = fn(hook_args, sample)
            return await result if inspect.isawaitable(result) else result
        except HookTimeout:
            raise
        except Exception as exc:
            exc.add_note(f"in reward function {name} (sample index {sample.index}, group {sample.group_index})")
            raise

    async def score(samples: list[Sample]) -> list[Any]:
        serial = asyncio.Lock()  # a plain function scores one sample at a time, as it always did
        return list(await gather_or_cancel(*(call(s, serial) for s in samples)))

    return score


GROUP_RM_SIGNATURE = "reward_func(args, samples: list[Sample], **kwargs) -> list[float | dict]"


def _per_group(fn: Callable[..., Any], name: str, hook_args: Any, timeout_s: float) -> Scorer:
    """``--group-rm``: one call ``fn(hook_args, group)`` per group (samples sharing a prompt), all groups
    concurrently, each at most ``timeout_s`` (``--hook-timeout``)."""
    serial = asyncio.Lock()

    async def call(group: list[Sample]) -> list[Any]:
        flag, path = name.split(" ", 1)
        result = await bounded(flag, path, timeout_s, fn, hook_args, group, serial=serial,
                               detail=f"group {group[0].group_index if group else None}")
        if len(result) != len(group):
            raise RuntimeError(f"{name} returned {len(result)} rewards for a group of {len(group)} samples")
        return list(result)

    async def score(samples: list[Sample]) -> list[Any]:
        groups: dict[Any, list[Sample]] = {}
        for s in samples:
            groups.setdefault(s.group_index, []).append(s)
        results = await gather_or_cancel(*(call(g) for g in groups.values()))
        by_id = {id(s): r for g, rs in zip(groups.values(), results, strict=True) for s, r in zip(g, rs, strict=True)}
        return [by_id[id(s)] for s in samples]
    return score


def _scorer(cfg: RewardConfig) -> Scorer:
    """Every reward function, built-in or the user's, gets the seeds' ``args`` (``cfg.args``). A GenRM judge
    (``--genrm-model-path``) scores in place of ``--rm-type``."""
    if cfg.genrm.enabled:
        from relax.engine.rewards.genrm import genrm_scorer

        return genrm_scorer(cfg.genrm)
    if cfg.group_rm:
        if not cfg.custom_rm_path:
            raise ConfigError("--group-rm needs --custom-rm-path (a function scoring a whole group)")
        fn = load_function(cfg.custom_rm_path, flag="--custom-rm-path", signature=GROUP_RM_SIGNATURE, min_args=2)
        return _per_group(fn, cfg.source, cfg.args, cfg.hook_timeout)
    if cfg.custom_rm_path:
        fn = load_function(cfg.custom_rm_path, flag="--custom-rm-path", signature=CUSTOM_RM_SIGNATURE, min_args=2)
        return _per_sample(fn, cfg.source, cfg.args, cfg.hook_timeout)
    if cfg.rm_type is None:
        raise ConfigError("no reward: set --rm-type (built-in: " + ", ".join(sorted(GRADERS)) + ") or --custom-rm-path")
    return _per_sample(get_reward_fn(cfg.rm_type), cfg.source, cfg.args)


async def compute_rewards(cfg: RewardConfig, samples: list[Sample]) -> list[float]:
    """Score every sample, store the raw result (float or dict) on ``sample.reward``, return the floats.

    A dict result needs ``--reward-key`` naming the value to train on; the full dict stays on
    the sample for logging (its other numeric keys become ``rollout/reward_extra/<key>`` metrics).
    A key the dict lacks fails here, at the first sample, naming the sample and the reward function.
    """
    # relax.algorithms imports torch: here, not at flag parsing (which imports .graders, so this package)
    from relax.algorithms import extract_reward

    raw = await _scorer(cfg)(samples)
    if len(raw) != len(samples):
        raise RuntimeError(f"reward scorer returned {len(raw)} rewards for {len(samples)} samples")
    out = []
    for s, r in zip(samples, raw, strict=True):
        s.reward = r
        try:
            out.append(extract_reward(r, cfg.reward_key))
        except (TypeError, ValueError) as exc:
            exc.add_note(f"reward of sample index {s.index} (group {s.group_index}) from {cfg.source}")
            raise
    return out
