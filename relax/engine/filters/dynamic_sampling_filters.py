"""Dynamic-sampling filters (``--dynamic-sampling-filter-path``), Relax signature
``filter(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput``."""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

from relax.algorithms.rewards import extract_reward
from relax.utils.types import Sample


@dataclass
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None


def check_reward_nonzero_std(args: Namespace, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """DAPO: drop a group whose rewards are all equal (all right or all wrong: zero advantage)."""
    rewards = [extract_reward(s.reward, getattr(args, "reward_key", None)) for s in samples]
    mean = sum(rewards) / len(rewards)
    std = (sum((r - mean) ** 2 for r in rewards) / len(rewards)) ** 0.5
    if std > 0.0:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{round(mean, 1)}")
