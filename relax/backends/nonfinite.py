"""The error both training backends raise for a non-finite gradient norm, before any weight changes.

A bare "grad norm is nan" leaves the user bisecting the model; naming the first parameters whose
gradient holds an inf or NaN (in parameter order: embedding, then layer by layer) says where the
blow-up starts, e.g. one layer's attention output or only the output layer.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def nonfinite_gradient_error(named_grads: Iterable[tuple[str, torch.Tensor | None]], grad_norm: float,
                             loss: float | None, limit: int = 5) -> FloatingPointError:
    bad = [name for name, g in named_grads if g is not None and not bool(torch.isfinite(g).all())]
    where = (f"; non-finite gradients in {len(bad)} parameter(s), first: {', '.join(bad[:limit])}" if bad
             else "; every gradient is finite, the norm itself overflowed")
    return FloatingPointError(f"non-finite gradient norm ({grad_norm}); loss was {loss}{where}")
