"""Tool environments for multi-turn rollouts, in the shape seed 004 migrates verl's tools to.

A recipe subclasses `BaseInteractionEnv` (stateful, one instance per sample) and exposes a
``build_env(sample=None, args=None, **kwargs)`` factory in its env module. The multi-turn rollout
(`relax.engine.rollout.multi_turn`) loads the module named by ``rollout_interaction_env_path`` in
the ``--custom-config-path`` YAML, builds one env per sample and drives it:

* ``reset() -> (observation, info)``: before the first turn. The prompt is the first observation,
  so what reset returns is not sent to the model (recipes put their start-up there).
* ``step(response_text) -> (observation, done, info)``: after every model turn; the observation
  is appended as the next user turn (its tokens masked out of the loss) unless ``done``.
* ``close()``: always, when the rollout of the sample ends (even by an error).

An observation is a dict ``{"obs_str": str, "role": "user"}`` (seed 004: verl's ``ToolResponse(text=...)``);
``multi_modal_data`` is not supported yet and is refused, not dropped.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any

Observation = dict[str, Any]
ENV_FACTORY_SIGNATURE = "build_env(sample: Sample = None, args=None, **kwargs) -> BaseInteractionEnv"


class BaseInteractionEnv(ABC):
    """One sample's environment: ``reset``, then ``step`` after each model turn until it says done."""

    @abstractmethod
    def reset(self) -> tuple[Observation | None, dict[str, Any]]:
        """Prepare for a new trajectory; returns (observation, info)."""

    @abstractmethod
    def step(self, response_text: str) -> tuple[Observation | None, bool, dict[str, Any]]:
        """React to the model's turn (its decoded text); returns (observation, done, info)."""

    def close(self) -> None:  # noqa: B027 - optional hook: most environments hold nothing to release
        """Release what the environment holds (tool processes, files)."""


def load_env_factory(module_path: str) -> Callable[..., BaseInteractionEnv]:
    """``build_env`` of the env module (``examples.my_algo.env_my_algo``), or a one-line error naming it."""
    from relax.utils.plugins import load_function

    return load_function(f"{module_path}.build_env", flag="rollout_interaction_env_path (--custom-config-path)",
                         signature=ENV_FACTORY_SIGNATURE)


def observation_text(obs: Observation | None, where: str) -> tuple[str, str]:
    """(text, role) of an observation; an empty or missing one is ("", "user")."""
    if obs is None:
        return "", "user"
    if not isinstance(obs, dict):
        raise TypeError(f"{where}: an observation must be a dict like {{'obs_str': ..., 'role': 'user'}}, "
                        f"got {type(obs).__name__}")
    if obs.get("multi_modal_data"):
        raise NotImplementedError(f"{where}: not supported yet: multi_modal_data in env observations")
    return str(obs.get("obs_str") or ""), str(obs.get("role") or "user")
