"""The engine launcher contract: every way engines come to exist (relax/core/engine_launchers.py, the SGLang
launcher in relax/backends/sglang/) implements `EngineLauncher` and reports an `EngineRecord` per engine.

A leaf module, so a launcher in a backend package and the registry in relax/core/ import it without importing
each other.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

from relax.utils.flag_slice import FlagSlice
from relax.weights.transports import SyncTarget


@dataclass
class EngineRecord:
    index: int
    target: SyncTarget
    actor: Any = None  # the Ray actor hosting it; None for an external engine
    pid: int | None = None
    node: str | None = None


class EngineLauncher(ABC):
    """Starts (or attaches to) engine ``index``; ``can_restart``: a dead one can be replaced. ``config_class``: the
    typed slice of flags the launcher reads, which the driver builds (relax/core/engines.py)."""

    name: ClassVar[str]
    can_restart: ClassVar[bool] = True
    config_class: ClassVar[type[FlagSlice]]
    graceful_stop: ClassVar[str | None] = None  # the engine actor's method that shuts its server down, if any
    # its engines take a batched /generate of media requests (relax/engine/rollout/engine_pool.py): SGLang 0.5.14's
    # fails such a batch when an item is answered before the last item's media are processed
    batches_media: ClassVar[bool] = False

    def __init__(self, cfg: FlagSlice, device: str, slots: list, *, host: str, api_key: str | None):
        self.cfg, self.device, self.slots = cfg, device, list(slots)  # one placement Slot per engine
        self.host, self.api_key = host, api_key

    @abstractmethod
    def count(self) -> int:
        """How many engines the run has."""

    @abstractmethod
    def begin(self, indices: list[int]) -> Any:
        """Start these engines without waiting (the trainer loads meanwhile); `finish` waits for them."""

    @abstractmethod
    def finish(self, pending: Any) -> list[EngineRecord]:
        """Wait until every engine `begin` started serves; their records."""

    def abandon(self, pending: Any) -> None:
        """Kill what `begin` started (an engine that missed its scale-out deadline): a `finish` still waiting on it
        ends. ``pending`` is ``(indices, actors)`` for every launcher that starts actors."""
        import ray

        for actor in pending[1] if isinstance(pending, tuple) and len(pending) == 2 else ():
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass

    def start_all(self, indices: list[int]) -> list[EngineRecord]:
        return self.finish(self.begin(indices))
