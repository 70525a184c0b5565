"""Off-Policy Sequence Masking (OPSM, DeepSeek-V3.2).

A sequence is dropped from the policy-gradient loss when it has a negative advantage AND
the policy that sampled it has drifted from the current one by more than ``--opsm-delta``,
measured as the token-mean of ``log pi_behaviour - log pi_current``. Negative samples that
are far off-policy are the ones whose gradient is most likely to be harmful; positive ones
are always kept.
"""

from __future__ import annotations

import torch


def opsm_mask(log_probs, behaviour_log_probs, advantages, loss_mask, delta: float) -> tuple[torch.Tensor, torch.Tensor]:
    n = loss_mask.sum(-1).clamp(min=1)
    seq_kl = ((behaviour_log_probs - log_probs).detach() * loss_mask).sum(-1) / n
    seq_adv = (advantages * loss_mask).sum(-1) / n
    drop = (seq_adv < 0) & (seq_kl > delta)
    keep = (~drop).to(loss_mask.dtype).unsqueeze(-1)
    return keep, drop.to(loss_mask.dtype).mean()
