"""Dynamic-sampling filters for ``--dynamic-sampling-filter-path``.

Relax/slime signature: ``filter(args, samples: list[Sample], **kwargs) -> DynamicFilterOutput``,
called once per group; a group with ``keep=False`` is dropped and ``reason`` is logged.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

from relax.algorithms.rewards import extract_reward
from relax.utils.types import Sample


@dataclass(frozen=True)
class DynamicFilterOutput:
    keep: bool
    reason: str | None = None


# seed hook: seed 000 --dynamic-sampling-filter-path (filter(args, samples, **kwargs))
def check_reward_nonzero_std(args: Namespace, samples: list[Sample], **kwargs) -> DynamicFilterOutput:
    """DAPO: drop a group whose rewards are all equal (all right or all wrong: zero GRPO advantage).

    Equality is exact rather than ``std > 0`` so float rounding of identical rewards cannot keep
    a group that carries no signal. Dict rewards are read through ``--reward-key``.
    """
    rewards = [extract_reward(s.reward, args.reward_key) for s in samples]
    if len(set(rewards)) > 1:
        return DynamicFilterOutput(keep=True)
    return DynamicFilterOutput(keep=False, reason=f"zero_std_{round(rewards[0], 1) if rewards else 'empty'}")
