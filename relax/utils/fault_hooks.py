"""Fault-injection hooks for the scenario harness (``RELAX_FAULT_<NAME>_AT_STEP=<step>``).

Faults that cannot be injected from outside a process (a reward function raising, a NaN
loss, a failing checkpoint write) are triggered here when the harness sets the matching
environment variable; Ray workers inherit every ``RELAX_*`` variable. Unset, they cost a
dictionary lookup and change nothing.
"""

from __future__ import annotations

import os

HOOKS = ("REWARD_RAISE", "NAN_LOSS", "CKPT_WRITE_FAIL")


def fault_at(name: str, step: int) -> bool:
    if name not in HOOKS:
        raise ValueError(f"unknown fault hook {name!r}; known: {', '.join(HOOKS)}")
    value = os.environ.get(f"RELAX_FAULT_{name}_AT_STEP")
    return value is not None and value.strip() == str(step)
