"""RL math: advantage estimators, policy and value losses, KL, off-policy corrections, reductions.

Pure torch, CPU-testable. Every function takes the typed `AlgorithmConfig`, never the flat
``args``. Formulas and every deliberate difference from Relax/slime: docs/algorithms.md.
"""

from relax.algorithms.advantages import AdvantageOutput, compute_advantages
from relax.algorithms.config import AlgorithmConfig
from relax.algorithms.critic import critic_lr_at, should_update_actor, value_loss
from relax.algorithms.policy_loss import policy_loss
from relax.algorithms.reducers import merge_metrics
from relax.algorithms.rewards import extract_reward

__all__ = [
    "AdvantageOutput",
    "AlgorithmConfig",
    "compute_advantages",
    "critic_lr_at",
    "extract_reward",
    "merge_metrics",
    "policy_loss",
    "should_update_actor",
    "value_loss",
]
