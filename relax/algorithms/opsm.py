"""Off-Policy Sequence Masking (OPSM, DeepSeek-V3.2 section 3.1; ``--use-opsm --opsm-delta``).

DeepSeek-V3.2 drops token t of sequence i from the policy-gradient loss when
``A_{i,t} < 0`` and ``(1/|o_i|) sum_t log(pi_behaviour / pi_theta) > delta``: a negative sample
that the current policy has drifted away from (its sequence-level KL, estimated on the
sample's own tokens, exceeds delta) is the one most likely to push the policy somewhere
harmful, while positive samples are always kept. The behaviour policy is the PPO ratio's
denominator (old log-probs, or rollout log-probs with ``--use-rollout-logprobs``). With
sequence-level advantages (GRPO family) this masks whole sequences; the mask is a constant.
"""

from __future__ import annotations

import torch


def opsm_mask(log_probs, behaviour_log_probs, advantages, loss_mask, delta: float) -> torch.Tensor:
    """1 for kept tokens, 0 for masked ones, shape [B, T]."""
    n = loss_mask.sum(-1, keepdim=True).clamp(min=1)
    seq_kl = ((behaviour_log_probs - log_probs).detach() * loss_mask).sum(-1, keepdim=True) / n
    return 1.0 - ((advantages < 0) & (seq_kl > delta)).to(loss_mask.dtype)
