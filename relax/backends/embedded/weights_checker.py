"""``/weights_checker``: prove that a weight sync writes every tensor.

Actions (``{"action": ...}``):

* ``snapshot``: keep a CPU copy of every state-dict tensor.
* ``reset_tensors``: overwrite every tensor with seeded noise (so a tensor that a later sync
  skips keeps a checksum that cannot match the trainer's).
* ``checksum``: per-tensor checksums keyed by HF name (`relax.weights.checksum`).
* ``compare``: compare the current weights with the snapshot, bit for bit; reports mismatches.
"""

from __future__ import annotations

from typing import Any

import torch

from relax.weights.checksum import state_checksums

ACTIONS = ("snapshot", "reset_tensors", "checksum", "compare")


class WeightsChecker:
    def __init__(self, model: torch.nn.Module):
        self.model = model
        self._snapshot: dict[str, torch.Tensor] | None = None

    def run(self, action: str, **kwargs: Any) -> dict[str, Any]:
        if action not in ACTIONS:
            raise ValueError(f"unknown weights_checker action {action!r}; one of {', '.join(ACTIONS)}")
        return getattr(self, action)(**kwargs)

    @torch.no_grad()
    def snapshot(self) -> dict[str, Any]:
        self._snapshot = {k: v.detach().cpu().clone() for k, v in self.model.state_dict().items()}
        return {"success": True, "num_tensors": len(self._snapshot)}

    @torch.no_grad()
    def reset_tensors(self, seed: int = 0) -> dict[str, Any]:
        gen = torch.Generator().manual_seed(int(seed))
        state = self.model.state_dict()
        seen: set[int] = set()
        for t in state.values():
            if t.data_ptr() in seen or not t.is_floating_point():
                continue
            seen.add(t.data_ptr())
            noise = torch.randn(t.shape, generator=gen, dtype=torch.float32) * 0.02 + 0.5
            t.copy_(noise.to(t.device, t.dtype))
        return {"success": True, "num_tensors": len(state)}

    def checksum(self) -> dict[str, Any]:
        return {"success": True, "checksums": state_checksums(self.model.state_dict().items())}

    @torch.no_grad()
    def compare(self) -> dict[str, Any]:
        if self._snapshot is None:
            raise ValueError("weights_checker compare needs a snapshot first")
        state = self.model.state_dict()
        mismatched = sorted(
            name for name, ref in self._snapshot.items()
            if name not in state or state[name].shape != ref.shape
            or not torch.equal(state[name].detach().cpu(), ref)
        )
        missing = sorted(set(state) - set(self._snapshot))
        return {"success": True, "equal": not mismatched and not missing, "mismatched": mismatched,
                "missing": missing, "num_tensors": len(state)}
