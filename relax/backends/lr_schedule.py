"""The learning rate of each optimizer step (``--lr-decay-style``): constant, or decayed to 0 over the run.

Megatron-LM's shapes without warm-up: ``linear`` falls from ``--lr`` to 0 in a straight line, ``cosine`` along
half a cosine, over every optimizer step of the run (``--num-rollout`` rollouts x the optimizer steps of one).
The rate of a step is a function of the rollout step and the step's place in it, so a resumed run continues
the same curve with no state of its own in the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relax.backends.config import TrainerConfig

STYLES = ("constant", "linear", "cosine")


@dataclass(frozen=True)
class LRSchedule:
    style: str
    lr: float
    steps_per_rollout: int  # optimizer steps of one rollout (global batches x --num-iters-per-train-update)
    total_steps: int  # of the run

    @classmethod
    def of(cls, cfg: TrainerConfig) -> LRSchedule:
        per_rollout = (cfg.rollout_batch_size * cfg.n_samples_per_prompt // cfg.global_batch_size
                       * cfg.num_iters_per_train_update)
        total = per_rollout * (cfg.num_rollout or 0)
        return cls(cfg.lr_decay_style, float(cfg.lr), max(per_rollout, 1), total)

    def lr_at(self, rollout_step: int, index: int) -> float:
        """The rate of the ``index``-th optimizer step of rollout step ``rollout_step``."""
        if self.style == "constant":
            return self.lr
        done = min((rollout_step * self.steps_per_rollout + index) / max(self.total_steps, 1), 1.0)
        if self.style == "linear":
            return self.lr * (1.0 - done)
        if self.style == "cosine":
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * done))
        raise ValueError(f"--lr-decay-style {self.style!r}: one of {', '.join(STYLES)}")
