"""Seed 004's ``reward_<algo>.py``: ``compute_score`` plus the async ``reward_func`` entry point.

The label is the expected answers, comma-separated (``"3,7"``); each model turn is compared with
its answer. Returns a dict: ``score`` (the share of correct turns; train with ``--reward-key score``),
``acc`` (1 when every turn is right) and ``turns`` (how many turns the model took), the last two
logged as ``rollout/reward_extra/acc`` and ``rollout/reward_extra/turns``.
"""

from __future__ import annotations

from relax.utils.types import Sample


def compute_score(answers: list[str], ground_truth: str) -> dict:
    expected = str(ground_truth).split(",")
    correct = sum(a == e for a, e in zip(answers, expected, strict=False))
    return {"score": correct / len(expected), "acc": float(correct == len(expected)), "turns": float(len(answers))}


async def reward_func(args, sample: Sample, **kwargs) -> dict:
    answers = [turn["text"].strip() for turn in sample.metadata.get("turns", [])]
    return compute_score(answers, sample.label)
