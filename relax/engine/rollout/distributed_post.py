"""``--use-distributed-post``: the rollout's POSTs to the engines go out from Ray poster actors, not the driver.

By default every ``/generate`` of a rollout (the batched shares of `HttpEnginePool`, and every
``relax.utils.http_utils.post`` of the driver: a ``--custom-generate-function-path`` hook's, the multi-turn
rollout's, the remote reward's at ``--rm-url``) is encoded, sent, awaited and
decoded on the driver's one event loop. With many engines, or a multi-turn hook that posts once per sample and turn,
that loop becomes the rollout's bottleneck. With the flag, the run starts one poster actor per rollout engine (spread
over the cluster's nodes, no CPU reserved: they wait on sockets) and each POST is handed to the next poster in turn;
the poster makes the same call (`relax.utils.http_utils.post`, same timeout, headers and retries) from its own
process and event loop and hands the decoded answer back. What is asked and answered is unchanged, and every caller
still awaits its own answer, so the samples, their order and the per-sample sampling seeds are those of the default
path. Errors come back as the same `EngineError` / `EngineHTTPError`, so fault tolerance sees what it sees without
the flag. Control calls (abort, pause, weights, health) stay on the driver: they are few and their order matters.

The posters are installed process-wide in the driver (`relax.utils.http_utils.install_poster`): seed 001's
recipes call the free function ``post(url, payload)`` and have no config to carry a pool. The run stops them at
its end (relax/core/runtime.py).
"""

from __future__ import annotations

import itertools
import os
from typing import Any

import ray


@ray.remote(num_cpus=0)
class PosterActor:
    """One process that makes POSTs for the driver (an async actor: many in flight on its own event loop)."""

    def pid(self) -> int:
        return os.getpid()

    async def post(self, url: str, payload: Any, options: dict[str, Any]) -> Any:
        from relax.utils.http_utils import local_post

        return await local_post(url, payload, **options)


class DistributedPoster:
    """The driver's handles on the poster actors; `post` sends one POST through the next in turn."""

    def __init__(self, actors: list, pids: list[int]) -> None:
        self.actors, self.pids = actors, pids
        self._next = itertools.cycle(range(len(actors)))

    @classmethod
    def start(cls, count: int) -> DistributedPoster:
        """``count`` posters (at least one), spread over the cluster's nodes; returns once each is up."""
        actors = [PosterActor.options(scheduling_strategy="SPREAD", max_concurrency=1000).remote()
                  for _ in range(max(1, count))]
        return cls(actors, ray.get([a.pid.remote() for a in actors]))

    async def post(self, url: str, payload: Any, **options: Any) -> Any:
        actor = self.actors[next(self._next)]
        try:
            return await actor.post.remote(url, payload, options)
        except ray.exceptions.RayTaskError as exc:  # the poster's own error (EngineError, ...), as raised there
            cause = getattr(exc, "cause", None)
            if isinstance(cause, BaseException):
                raise cause from None
            raise

    def stop(self) -> None:
        for actor in self.actors:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
