"""The learning rate of each optimizer step (``--lr-decay-style``), as megatron-core's scheduler computes it.

Megatron-LM's shapes (``megatron.core.optimizer_param_scheduler``) without warm-up and with a minimum rate of 0,
over every optimizer step of the run (``--num-rollout`` rollouts x the optimizer steps of one); step ``g`` (from 0)
takes Megatron's rate at ``num_steps = g``, which is the rate Megatron-LM's loop hands its ``g``-th step:
``linear`` falls from ``--lr`` to 0 in a straight line, ``cosine`` along half a cosine, ``inverse-square-root`` is
``--lr / sqrt(max(g, 1))``, and ``WSD`` (warm-up, stable, decay) holds ``--lr`` until its last
``--lr-wsd-decay-iters`` steps, then anneals to 0 in ``--lr-wsd-decay-style``'s shape. Both backends set each
step's rate from here. The rate of a step is a function of the rollout step and the step's place in it, so a
resumed run continues the same curve with no state of its own in the checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from relax.backends.config import TrainerConfig

STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
# the shape of WSD's anneal, a coefficient of the anneal's done fraction (Megatron-LM's --lr-wsd-decay-style)
WSD_STYLES = {
    "linear": lambda done: 1.0 - done,
    "cosine": lambda done: 0.5 * (math.cos(math.pi * done) + 1.0),
    "exponential": lambda done: 2.0 * math.pow(0.5, done) - 1.0,
    "minus_sqrt": lambda done: 1.0 - math.sqrt(done),
}


@dataclass(frozen=True)
class LRSchedule:
    style: str
    lr: float
    steps_per_rollout: int  # optimizer steps of one rollout (global batches x --num-iters-per-train-update)
    total_steps: int  # of the run
    wsd_decay_steps: int | None = None  # WSD: the anneal's optimizer steps, the run's last ones
    wsd_style: str = "exponential"

    @classmethod
    def of(cls, cfg: TrainerConfig) -> LRSchedule:
        per_rollout = (cfg.rollout_batch_size * cfg.n_samples_per_prompt // cfg.global_batch_size
                       * cfg.num_iters_per_train_update)
        total = per_rollout * (cfg.num_rollout or 0)
        return cls(cfg.lr_decay_style, float(cfg.lr), max(per_rollout, 1), total, cfg.lr_wsd_decay_iters,
                   cfg.lr_wsd_decay_style)

    def lr_at(self, rollout_step: int, index: int) -> float:
        """The rate of the ``index``-th optimizer step of rollout step ``rollout_step``."""
        if self.style == "constant":
            return self.lr
        step = rollout_step * self.steps_per_rollout + index
        if step > self.total_steps:  # past the decay (a run resumed with a longer --num-rollout): Megatron's min_lr
            return 0.0
        if self.style == "inverse-square-root":
            return self.lr / math.sqrt(max(step, 1))
        done = step / max(self.total_steps, 1)
        if self.style == "linear":
            return self.lr * (1.0 - done)
        if self.style == "cosine":
            return self.lr * 0.5 * (1.0 + math.cos(math.pi * done))
        if self.style == "WSD":
            if self.wsd_decay_steps is None:
                raise ValueError("--lr-decay-style WSD needs --lr-wsd-decay-iters")
            anneal_start = self.total_steps - self.wsd_decay_steps
            if step <= anneal_start:
                return self.lr
            return self.lr * WSD_STYLES[self.wsd_style]((step - anneal_start) / self.wsd_decay_steps)
        raise ValueError(f"--lr-decay-style {self.style!r}: one of {', '.join(STYLES)}")
