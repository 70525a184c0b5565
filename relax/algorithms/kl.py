"""Per-token KL estimators between two policies (Schulman's k1/k2/k3), selected by ``--kl-loss-type``.

With ``log_ratio = log_probs - base_log_probs`` (samples drawn from the first policy):
k1 = log_ratio; k2 = log_ratio**2 / 2; k3 = exp(-log_ratio) - 1 + log_ratio (>= 0, unbiased, low
variance); low_var_kl = k3 clamped to [-10, 10] (verl/slime's guard against exp overflow).
``importance_ratio`` implements ``--use-unbiased-kl`` (DeepSeek-V3.2): the samples come from the
old policy, so each estimate is weighted by pi_theta / pi_old; like slime, the low_var_kl clamp is
applied after the weighting and the ratio keeps its gradient (the weighted estimate is an unbiased
estimate of KL(pi_theta || pi_ref) whose gradient is the KL's gradient).
"""

from __future__ import annotations

from collections.abc import Callable

import torch

KL_ESTIMATORS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "k1": lambda lr: lr,
    "k2": lambda lr: 0.5 * lr.square(),
    "k3": lambda lr: torch.expm1(-lr) + lr,
    "low_var_kl": lambda lr: torch.expm1(-lr) + lr,
}


def kl_estimate(
    log_probs: torch.Tensor,
    base_log_probs: torch.Tensor,
    kind: str,
    importance_ratio: torch.Tensor | None = None,
) -> torch.Tensor:
    try:
        fn = KL_ESTIMATORS[kind]
    except KeyError:
        raise ValueError(f"unknown --kl-loss-type {kind!r}; known: {', '.join(KL_ESTIMATORS)}") from None
    kl = fn(log_probs - base_log_probs)
    if importance_ratio is not None:
        kl = importance_ratio * kl
    if kind == "low_var_kl":
        kl = kl.clamp(-10.0, 10.0)
    return kl
