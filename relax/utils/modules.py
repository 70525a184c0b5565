"""Optional packages: whether one is importable without importing it (megatron-core, Transformer Engine,
triton), and relax's own modules that need one (the Triton kernels), imported once or None."""

from __future__ import annotations

import functools
import importlib
import importlib.util
import logging
from types import ModuleType

log = logging.getLogger(__name__)


def module_available(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


@functools.cache
def optional_module(name: str, without: str) -> ModuleType | None:
    """Import ``name`` once; None where an import it needs is missing, logged once with ``without`` (what runs
    instead), e.g. a Triton kernel module on a machine without triton."""
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        log.warning("%s is not importable (%s): %s", name, exc, without)
        return None
