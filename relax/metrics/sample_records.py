"""What samples.jsonl says about one sample besides its fate: reward, response length, response text.

``loss_tokens`` counts the response tokens the loss sees (``loss_mask`` 1): a multi-turn sample's
environment observations are in ``response_length`` but not in ``loss_tokens``.

A user checks here that a custom reward ran (its value per sample) and what the model wrote; the
response text is cut to `RESPONSE_CHARS` characters (``response_truncated`` says when) so the file
stays small on long rollouts.
"""

from __future__ import annotations

import math
from typing import Any

from relax.utils.types import Sample

RESPONSE_CHARS = 200


def scalar_reward(reward: Any, reward_key: str | None) -> float | None:
    """The trained-on value of a sample's raw reward (a float, or a dict's ``--reward-key``), None when absent."""
    if isinstance(reward, dict):
        value = reward.get(reward_key) if reward_key is not None else None
    else:
        value = reward
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def sample_fields(sample: Sample, reward_key: str | None) -> dict[str, Any]:
    """``reward``, ``response_length``, ``response`` (cut) and ``response_truncated`` of a generated sample."""
    text = sample.response or ""
    return {"reward": scalar_reward(sample.reward, reward_key), "response_length": sample.response_length,
            "loss_tokens": sum(sample.effective_loss_mask()), "response": text[:RESPONSE_CHARS],
            "response_truncated": len(text) > RESPONSE_CHARS}


def reward_extras(samples: list[Sample], reward_key: str | None) -> dict[str, float]:
    """``rollout/reward_extra/<key>``: the mean of every other numeric key of dict rewards (``acc``, ``len``, ...)."""
    values: dict[str, list[float]] = {}
    for s in samples:
        if not isinstance(s.reward, dict):
            continue
        for key, value in s.reward.items():
            if key != reward_key and isinstance(value, int | float) and math.isfinite(float(value)):
                values.setdefault(str(key), []).append(float(value))
    return {f"rollout/reward_extra/{k}": sum(v) / len(v) for k, v in sorted(values.items())}
