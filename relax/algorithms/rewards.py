"""Turning a reward function's result into the scalar the estimators use."""

from __future__ import annotations

import math
from typing import Any


def extract_reward(reward: Any, key: str | None) -> float:
    """A float reward passes through; a dict reward needs ``--reward-key`` naming the value. A reward that is not
    finite is refused here, where the caller can name the function that gave it: past this point a NaN shows up
    only as a non-finite gradient norm."""
    if isinstance(reward, dict):
        if key is None:
            raise ValueError(f"reward is a dict with keys {sorted(reward)}; set --reward-key")
        if key not in reward:
            raise ValueError(f"--reward-key {key!r} not in reward dict (keys: {sorted(reward)})")
        value = float(reward[key])
    elif reward is None:
        raise ValueError("sample has no reward (the reward function returned None, or did not run)")
    else:
        value = float(reward)
    if not math.isfinite(value):
        raise ValueError(f"reward is {value} (a reward must be a finite number)")
    return value
