"""Whether an optional package is importable, without importing it (megatron-core, Transformer Engine, triton)."""

from __future__ import annotations

import importlib.util


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False
