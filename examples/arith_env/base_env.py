"""Seed 004's ``examples/<algo>/base_env.py``: the environment base class, here imported from relax."""

from relax.engine.rollout.interaction_env import BaseInteractionEnv

__all__ = ["BaseInteractionEnv"]
