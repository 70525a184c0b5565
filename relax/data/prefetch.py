"""The streaming prefetch cache (``--prefetch-chunk-size``, ``--prefetch-max-cached``, ``--prefetch-num-workers``).

With ``--use-streaming-dataset`` and ``--multimodal-keys``, a background thread draws records from the stream
ahead of the rollout, ``chunk_size`` per round, and hands each record's media to a pool of ``num_workers``
threads; at most ``max_cached`` drawn records wait in the cache, and the thread sleeps while it is full. The
rollout takes records in draw order, so the samples are the same as without the cache, only ready sooner.

Resume stays exact although the stream runs ahead: each round keeps the stream's state from before its first
draw, and `state_dict` is the state of the round of the oldest record not yet taken plus how many of that
round were taken; `load_state_dict` restores it and draws those again, discarding them (draws are
deterministic for a state).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from relax.data.streaming import Drawn, StreamingRecords


@dataclass
class _Entry:
    drawn: Drawn
    future: Future | None  # the record's PreparedImages (None: no images)
    round: int


class PrefetchBuffer:
    def __init__(self, stream: StreamingRecords, media: Any, *, chunk_size: int, max_cached: int, num_workers: int):
        self.stream, self.media = stream, media
        self.chunk_size, self.max_cached = chunk_size, max_cached
        self.pool = ThreadPoolExecutor(max_workers=num_workers, thread_name_prefix="relax-prefetch")
        self.rounds: list[int] = []  # records drawn per round (what --prefetch-chunk-size bounds)
        self._snapshots: dict[int, dict[str, Any]] = {}  # round -> the stream's state before it
        self._taken: dict[int, int] = {}  # round -> records of it already taken
        self._cache: deque[_Entry] = deque()
        self._cond = threading.Condition()
        self._error: BaseException | None = None
        self._stopped = False
        self._thread: threading.Thread | None = None
        self._start()

    @property
    def cached(self) -> int:
        with self._cond:
            return len(self._cache)

    def _start(self) -> None:
        self._stopped, self._error = False, None
        self._thread = threading.Thread(target=self._run, name="relax-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stopped and len(self._cache) >= self.max_cached:
                    self._cond.wait()
                if self._stopped:
                    return
                n = min(self.chunk_size, self.max_cached - len(self._cache))
                r = len(self.rounds)
                self._snapshots[r] = self.stream.state_dict()
                try:
                    for _ in range(n):
                        drawn = self.stream.next()
                        future = self.pool.submit(self.media.prepare, drawn.record, drawn.where)
                        self._cache.append(_Entry(drawn, future, r))
                except Exception as exc:  # noqa: BLE001 - handed to the consumer, who raises it in its own thread
                    self._error = exc
                    self._cond.notify_all()
                    return
                self.rounds.append(n)
                self._cond.notify_all()

    def next(self) -> tuple[Drawn, Any]:
        """The next record in draw order and its prepared media (waits for them)."""
        with self._cond:
            while not self._cache and self._error is None:
                self._cond.wait()
            if not self._cache:
                raise self._error
            entry = self._cache.popleft()
            self._taken[entry.round] = self._taken.get(entry.round, 0) + 1
            self._forget_done_rounds()
            self._cond.notify_all()
        return entry.drawn, entry.future.result() if entry.future is not None else None

    def _forget_done_rounds(self) -> None:
        oldest = self._cache[0].round if self._cache else len(self.rounds)
        for r in [r for r in self._snapshots if r < oldest]:
            del self._snapshots[r]
            self._taken.pop(r, None)

    def state_dict(self) -> dict[str, Any]:
        """The consumer's position: a stream state and how many records after it were taken (plain data)."""
        with self._cond:
            if not self._cache:
                return {"stream": self.stream.state_dict(), "skip": 0}
            r = self._cache[0].round
            return {"stream": self._snapshots[r], "skip": self._taken.get(r, 0)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.close(wait=True)
        self._cache.clear()
        self._snapshots.clear()
        self._taken.clear()
        self.stream.load_state_dict(state["stream"])
        for _ in range(state.get("skip", 0)):
            self.stream.next()
        self._start()

    def close(self, wait: bool = False) -> None:
        with self._cond:
            self._stopped = True
            self._cond.notify_all()
        if wait and self._thread is not None:
            self._thread.join()


def prefetch_problems(chunk_size: int, max_cached: int, num_workers: int) -> list[str]:
    """One line per bad prefetch flag value (--prefetch-chunk-size, --prefetch-max-cached, --prefetch-num-workers)."""
    problems = []
    if chunk_size < 1:
        problems.append(f"--prefetch-chunk-size {chunk_size} must be >= 1")
    if max_cached < 0:
        problems.append(f"--prefetch-max-cached {max_cached} must be >= 0 (0: no prefetching)")
    if num_workers < 1:
        problems.append(f"--prefetch-num-workers {num_workers} must be >= 1")
    return problems
