"""Seed 004's ``rollout.py``: the multi-turn rollout bound to this example's environment."""

from __future__ import annotations

from relax.engine.rollout.multi_turn import generate as multi_turn_generate

DEFAULT_ENV_MODULE = "examples.arith_env.env_arith"


async def generate(args, sample, sampling_params, evaluation: bool = False):
    return await multi_turn_generate(args, sample, sampling_params, evaluation, env_module=DEFAULT_ENV_MODULE)
