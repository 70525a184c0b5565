"""Rewards for the "mechanics" scenarios (``--custom-rm-path harness.rewards.digit_share``).

Those scenarios generate multi-token responses (up to 24 tokens, ending by EOS or by length) so that
decode past the 8th token, weight syncs, parity and accounting run on realistic sequences. A random-init
tiny model does not learn a multi-token task by RL within a few steps (MACHINES.md), so an exact-match
reward would be 0 for every sample: GRPO advantages would vanish and loss parity would compare an entropy
bonus. ``digit_share`` is dense instead: the share of the response's characters that are digits (about
10% for the random char-vocabulary model, different for every sample), so every group has non-zero
advantages and the policy-gradient term is exercised. Learning is checked by the one-token
``colocate-learns-cpu`` scenario.
"""

from __future__ import annotations

from typing import Any


def digit_share(args: Any, sample: Any, **kwargs: Any) -> float:
    """Share of the response's characters that are digits (0.0 for an empty response)."""
    text = sample.response or ""
    return sum(ch.isdigit() for ch in text) / len(text) if text else 0.0


def judgement_length(judgement: str, sample: Any) -> float:
    """A GenRM reward_parser (--genrm-engine-config): the judgement's length in characters / 100, so a random-init
    judge's garbage still gives a defined reward that comes from the judge (scenarios/specs/genrm.yaml)."""
    return len(judgement) / 100.0
