"""The router of a training run: `relax.engine.router.Router` served from a thread of the driver.

Rollout functions, custom generate functions and evaluation post to its ``/generate``
(``args.sglang_router_ip`` / ``args.sglang_router_port``), whatever engines stand behind it. It
listens on loopback: everything that posts to it runs in the driver process.
"""

from __future__ import annotations

from argparse import Namespace
from dataclasses import dataclass

from relax.backends.embedded.hosting import Served, serve_in_thread
from relax.engine.router.router import Router

GENERATE_TIMEOUT_S = 600.0
"""How long the run's router waits for one engine's answer to a request (a batched /generate: a share of a
rollout step) when --slime-router-timeout is unset; an engine that does not answer in time fails the request
(the run, without --use-fault-tolerance) in one line naming it. A hung engine that still answers /health is
found only this way: set --slime-router-timeout to the longest a rollout step's share may take (docs/waits.md)."""


@dataclass(frozen=True)
class RouterConfig:
    """The seed's Router Configuration flags that apply to our router (a typed slice of the flags)."""

    failure_threshold: int = 3  # --slime-router-health-check-failure-threshold
    request_timeout: float = GENERATE_TIMEOUT_S  # --slime-router-timeout
    max_connections: int = 1024  # --slime-router-max-connections
    failover: bool = True  # --use-fault-tolerance: retry a request on another engine when one fails

    @classmethod
    def from_args(cls, args: Namespace) -> RouterConfig:
        return cls(failure_threshold=args.slime_router_health_check_failure_threshold,
                   request_timeout=args.slime_router_timeout or GENERATE_TIMEOUT_S,
                   max_connections=args.slime_router_max_connections or cls.max_connections,
                   failover=bool(args.use_fault_tolerance))


class RouterThread:
    def __init__(self, worker_urls: list[str], config: RouterConfig, *, worker_api_key: str | None = None):
        self.router = Router(worker_urls, failure_threshold=config.failure_threshold, health_timeout=5.0,
                             request_timeout=config.request_timeout, max_connections=config.max_connections,
                             worker_api_key=worker_api_key, failover=config.failover, remove_unhealthy=False)
        self.served: Served = serve_in_thread(self.router.app(), "127.0.0.1", name="relax-router")

    @property
    def url(self) -> str:
        return self.served.url

    def add_worker(self, url: str) -> None:
        self.served.call(lambda: self.router.add_worker(url))

    def remove_worker(self, url: str) -> None:
        self.served.call(lambda: self.router.remove_worker(url))

    def worker_urls(self) -> list[str]:
        return self.served.call(lambda: list(self.router.workers))
