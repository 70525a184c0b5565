"""Per-token KL estimators between the current policy and a reference (Schulman's k1/k2/k3).

With ``log_ratio = log_probs - ref_log_probs``:
k1 = log_ratio; k2 = log_ratio**2 / 2; k3 = exp(-log_ratio) - 1 + log_ratio (>= 0);
low_var_kl = k3 clamped to [-10, 10] (verl/slime's numerically safe variant).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda lr: lr,
    "k2": lambda lr: 0.5 * lr.square(),
    "k3": lambda lr: torch.expm1(-lr) + lr,
    "low_var_kl": lambda lr: (torch.expm1(-lr) + lr).clamp(-10.0, 10.0),
}


def kl_estimate(log_probs: torch.Tensor, ref_log_probs: torch.Tensor, kind: str) -> torch.Tensor:
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown --kl-loss-type {kind!r}; known: {', '.join(KL_ESTIMATORS)}") from None
    return fn(log_probs - ref_log_probs)
