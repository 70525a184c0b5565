"""fp32 master weights for ``--bf16`` training with the torch backend (Megatron-LM's mixed precision).

The model holds bf16 parameters, so its forward and backward run in bf16 and the weights it exports
(to engines, checksums, ``--save-hf``) are bf16. The optimizer steps fp32 copies instead: after each
micro-batch's backward the bf16 gradients are added into fp32 master gradients (so accumulation over
micro-batches loses nothing to bf16 rounding) and the model's gradients freed; after the step the
updated masters are rounded into the model. Adam's moments are fp32 because the masters are.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class MasterWeights(torch.nn.Module):
    """fp32 copies of a model's trainable parameters, in order, kept as a module (so offloading moves them)."""

    def __init__(self, named_params: Iterable[tuple[str, torch.nn.Parameter]]):
        super().__init__()
        pairs = list(named_params)
        self.names = [name for name, _ in pairs]
        self.model_params = [p for _, p in pairs]
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(p.detach().to(torch.float32).clone()) for p in self.model_params])

    def accumulate(self) -> None:
        """Add the model's bf16 gradients (one micro-batch's) into the fp32 master gradients; free the bf16 ones."""
        for p, m in zip(self.model_params, self.params, strict=True):
            if p.grad is None:
                continue
            if m.grad is None:
                m.grad = p.grad.to(torch.float32)
            else:
                m.grad.add_(p.grad.to(torch.float32))
            p.grad = None

    def named_grads(self) -> Iterable[tuple[str, torch.Tensor | None]]:
        return zip(self.names, (m.grad for m in self.params), strict=True)

    @torch.no_grad()
    def copy_to_model(self) -> None:
        """Round the updated masters into the model's parameters."""
        for p, m in zip(self.model_params, self.params, strict=True):
            p.copy_(m)

    def state(self) -> dict[str, torch.Tensor]:
        return {name: m.detach().cpu().contiguous() for name, m in zip(self.names, self.params, strict=True)}

    @torch.no_grad()
    def load(self, state: dict[str, torch.Tensor]) -> None:
        missing = [n for n in self.names if n not in state]
        if missing:
            raise ValueError(f"master weights checkpoint lacks {missing[:3]}")
        for name, m in zip(self.names, self.params, strict=True):
            m.copy_(state[name])
