"""Turning a reward function's result into the scalar the estimators use."""

from __future__ import annotations

from typing import Any


def extract_reward(reward: Any, key: str | None) -> float:
    """A float reward passes through; a dict reward needs ``--reward-key`` naming the value."""
    if isinstance(reward, dict):
        if key is None:
            raise ValueError(f"reward is a dict with keys {sorted(reward)}; set --reward-key")
        if key not in reward:
            raise ValueError(f"--reward-key {key!r} not in reward dict (keys: {sorted(reward)})")
        return float(reward[key])
    if reward is None:
        raise ValueError("sample has no reward (the reward function did not run)")
    return float(reward)
