"""The torch optimizer a model steps with (``--optimizer``): AdamW, or SGD with momentum.

Megatron-LM's two choices. The torch backend's policy and every backend's critic build theirs here; the Megatron
backend hands ``--optimizer`` and ``--sgd-momentum`` to megatron-core's ``OptimizerConfig``, which builds torch's
``Adam`` / ``SGD`` itself (its fallback without Transformer Engine or Apex). A checkpoint's optimizer state only
fits the optimizer that wrote it, so a resume under the other ``--optimizer`` is refused in one line
(`check_saved_state`) rather than loading moments into a momentum optimizer or the reverse.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from relax.backends.config import TrainerConfig

ADAM_EPS = 1e-8


def build_optimizer(params: Iterable[torch.nn.Parameter], cfg: TrainerConfig, lr: float) -> torch.optim.Optimizer:
    """``--optimizer adam``: AdamW (decoupled weight decay); ``sgd``: SGD with ``--sgd-momentum`` (L2 weight decay,
    as torch and megatron-core apply it)."""
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=cfg.sgd_momentum, weight_decay=cfg.weight_decay)
    return torch.optim.AdamW(params, lr=lr, betas=(cfg.adam_beta1, cfg.adam_beta2), eps=ADAM_EPS,
                             weight_decay=cfg.weight_decay)


def saved_kind(state: dict[str, Any]) -> str:
    """The ``--optimizer`` whose ``state_dict()`` this is: SGD's parameter groups hold ``momentum``, Adam's ``betas``."""
    groups = state.get("param_groups") or [{}]
    return "sgd" if "momentum" in groups[0] else "adam"


def load_saved_state(optimizer: torch.optim.Optimizer, path: Path) -> None:
    """``optimizer.load_state_dict`` of the state saved at ``path``, refused if another ``--optimizer`` saved it."""
    saved = torch.load(path, weights_only=False)
    check_saved_state(saved, optimizer, path)
    optimizer.load_state_dict(saved)


def check_saved_state(state: dict[str, Any], optimizer: torch.optim.Optimizer, path: object) -> None:
    """Refuse optimizer state that another ``--optimizer`` saved (``path`` names the file in the message)."""
    want = "sgd" if isinstance(optimizer, torch.optim.SGD) else "adam"
    got = saved_kind(state)
    if got != want:
        raise ValueError(f"{path}: optimizer state saved with --optimizer {got}, this run uses --optimizer {want}; "
                         f"resume with --optimizer {got}")
