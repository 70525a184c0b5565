"""Executor registry: ``local`` (subprocess + process group) and ``docker`` (SDK, host network)."""

from harness.executors import docker, local  # noqa: F401
from harness.executors.base import EXECUTORS, Executor, Launch, Outcome, RunHandle

__all__ = ["EXECUTORS", "Executor", "Launch", "Outcome", "RunHandle", "make_executor"]


def make_executor(name: str, **kwargs) -> Executor:
    return EXECUTORS.get(name)(**kwargs)
