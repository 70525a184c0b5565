"""Wall-clock spans a process records for the run's timeline (``--timeline-dump-dir``): off, and free, unless
enabled. The driver's recorder holds the rollout's generate and reward spans; a trainer rank's spans travel
back with its step's metrics under `SPANS_KEY` and join the driver's (relax/core/runtime.py)."""

from __future__ import annotations

import threading
import time
from typing import Any

SPANS_KEY = "_timeline_spans"  # in a train step's metrics: the trainer's spans, popped before metrics.jsonl


class SpanRecorder:
    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._spans: list[dict[str, Any]] = []

    def record(self, name: str, row: str, start: float, end: float, **fields: Any) -> None:
        """A span ``name`` on the timeline's row ``row`` from ``start`` to ``end`` (unix seconds)."""
        if self.enabled:
            with self._lock:
                self._spans.append({"name": name, "row": row, "start": start, "end": end, **fields})

    def extend(self, spans: list[dict[str, Any]]) -> None:
        if self.enabled:
            with self._lock:
                self._spans.extend(spans)

    def drain(self) -> list[dict[str, Any]]:
        with self._lock:
            spans, self._spans = self._spans, []
        return spans


def wall(perf_counter_time: float) -> float:
    """The unix time of a ``time.perf_counter()`` reading taken earlier in this process."""
    return time.time() - (time.perf_counter() - perf_counter_time)


RECORDER = SpanRecorder()  # this process's spans (the driver's, or one trainer rank's)
