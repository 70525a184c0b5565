"""``--keep-old-actor``: a frozen copy of the weights the engines generate with, for the old log-probs.

With ``--update-weights-interval N > 1`` the engines keep one weight version for N rollout steps while
the trainer's weights move on after every step. The PPO ratio's denominator (the old log-probs) should
be the policy that generated the data; without this copy the trainer computes it with its current
weights. `OldActor` holds the weights of the last sync (the initial weights, or the checkpoint a run
resumes from, until the first one) and takes the trainer's weights again exactly when a step ends with
a sync, on the same schedule as `relax.core.runtime.Runtime.sync_due`. It costs one more model copy on
the trainer's device (moved with the model by ``--offload-train``).
"""

from __future__ import annotations

import copy

import torch


class OldActor:
    def __init__(self, model: torch.nn.Module, update_weights_interval: int):
        self.model = copy.deepcopy(model).requires_grad_(False)  # same train/eval mode as the policy
        self.interval = int(update_weights_interval)
        self.refreshes = 0  # how often the copy took the trainer's weights after the first

    def after_step(self, step: int, model: torch.nn.Module) -> bool:
        """Step ``step`` has trained: when it ends with a sync, the engines get ``model``'s weights, so does the copy."""
        if (step + 1) % self.interval:
            return False
        self.refresh(model)
        return True

    @torch.no_grad()
    def refresh(self, model: torch.nn.Module) -> None:
        """Take ``model``'s weights (parameters and buffers) bitwise."""
        for old, new in zip(self.model.parameters(), model.parameters(), strict=True):
            old.copy_(new)
        for old, new in zip(self.model.buffers(), model.buffers(), strict=True):
            old.copy_(new)
        self.refreshes += 1
