"""``--keep-old-actor``: a frozen copy of the weights the engines generate with, for the old log-probs.

With ``--update-weights-interval N > 1`` the engines keep one weight version for N rollout steps while
the trainer's weights move on after every step. The PPO ratio's denominator (the old log-probs) should
be the policy that generated the data; without this copy the trainer computes it with its current
weights. `OldActor` holds the weights of the last sync (the initial weights, or the checkpoint a run
resumes from, until the first one) and takes the trainer's weights again exactly when a step ends with
a sync, on the same schedule as `relax.core.runtime.Runtime.sync_due`. It costs one more model copy on
the trainer's device (moved with the model by ``--offload-train``). The backend builds the copy: the torch
backend deep-copies its model, the Megatron backend builds one more GPTModel in the policy's parallel layout
(a DDP-wrapped model cannot be deep-copied).
"""

from __future__ import annotations

import torch


class OldActor:
    def __init__(self, copy: torch.nn.Module, update_weights_interval: int):
        """``copy``: a model of the policy's structure holding its current weights (not shared with it)."""
        self.model = copy.requires_grad_(False)
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
