"""RL math: advantage estimators, policy loss, KL, reductions (pure torch, CPU-testable)."""

from relax.algorithms.advantages import AdvantageOutput, compute_advantages
from relax.algorithms.config import AlgorithmConfig
from relax.algorithms.policy_loss import policy_loss
from relax.algorithms.rewards import extract_reward

__all__ = ["AdvantageOutput", "AlgorithmConfig", "compute_advantages", "extract_reward", "policy_loss"]
