"""A weight sync's HF-named buckets into a one-rank megatron-core model (the fully-async services' copy).

A sync sends full HF tensors in buckets (relax/weights/); the model holds fused megatron parameters
(``linear_qkv`` from q/k/v, ``linear_fc1`` from gate/up, a vocab-padded embedding). `SyncLoader` keeps the
HF pieces of a fused parameter until all have arrived (a sender may split them over buckets), then packs
them with the same `ShardPlan.read` the checkpoint load uses and copies the result in, so a synced weight
equals a loaded one bit for bit. A tied ``lm_head.weight`` is the embedding under another name, so writing
it writes the embedding (as in the HF model, where both names are one tensor). `incomplete` names what a
fused parameter still waits for: a forward with any is refused rather than run on half-written weights.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from relax.backends.megatron.hf_source import StateDictReader
from relax.backends.megatron.layout import Param
from relax.backends.megatron.weights import ShardPlan


class SyncLoader:
    """HF-named tensors -> the fused parameters of ``module`` (a world of one: every parameter is whole here)."""

    def __init__(self, module: torch.nn.Module, plan: ShardPlan):
        if plan.par.tp * plan.par.pp * plan.par.ep * plan.par.etp != 1:
            raise ValueError(f"a weight sync loads into a model of one rank, not {plan.par}")
        self.plan = plan
        self.params = module.state_dict(keep_vars=True)
        self.owner: dict[str, tuple[Param, str]] = {}  # HF name -> (catalogue param, its local name)
        self.aliases: dict[str, str] = {}  # tied lm_head -> the HF name it equals
        for param, local in plan.mine():
            if param.load_only:
                continue
            for name in param.hf:
                self.owner[name] = (param, local)
            for alias in param.hf_aliases:
                self.aliases[alias] = param.hf[0]
        self.pending: dict[str, dict[str, torch.Tensor]] = {}  # local name -> the HF pieces received so far

    @torch.no_grad()
    def load(self, named: Iterable[tuple[str, torch.Tensor]]) -> None:
        named = list(named)
        unknown = [name for name, _ in named if name not in self.owner and name not in self.aliases]
        if unknown:
            raise ValueError(f"unknown weights {unknown[:3]} (not in the model's HF checkpoint names)")
        for name, tensor in named:
            name = self.aliases.get(name, name)
            param, local = self.owner[name]
            pieces = self.pending.setdefault(local, {})
            pieces[name] = tensor
            if len(pieces) == len(param.hf):
                del self.pending[local]
                self._copy_in(param, local, pieces)

    def _copy_in(self, param: Param, local: str, pieces: dict[str, torch.Tensor]) -> None:
        target = self.params[local]
        full = self.plan.read(param, StateDictReader(pieces))
        if tuple(full.shape) != tuple(target.shape):
            raise ValueError(f"{', '.join(param.hf)}: shape {list(full.shape)} does not fit {local} "
                             f"{list(target.shape)}")
        target.copy_(full.to(device=target.device, dtype=target.dtype))

    def incomplete(self) -> list[str]:
        """The HF tensors a fused parameter still waits for (some of its pieces arrived, not all)."""
        return sorted(name for local, pieces in self.pending.items()
                      for name in self.owner[next(iter(pieces))][0].hf if name not in pieces)
