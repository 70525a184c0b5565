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


@dataclass(frozen=True)
class RouterConfig:
    """The seed's Router Configuration flags that apply to our router (a typed slice of the flags)."""

    failure_threshold: int = 3  # --slime-router-health-check-failure-threshold
    request_timeout: float | None = None  # --slime-router-timeout
    max_connections: int = 1024  # --slime-router-max-connections
    failover: bool = True  # --use-fault-tolerance: retry a request on another engine when one fails

    @classmethod
    def from_args(cls, args: Namespace) -> RouterConfig:
        return cls(failure_threshold=args.slime_router_health_check_failure_threshold,
                   request_timeout=args.slime_router_timeout,
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
