"""The router of a training run: `relax.engine.router.Router` served from a thread of the driver.

Rollout functions, custom generate functions and evaluation post to its ``/generate``
(``args.sglang_router_ip`` / ``args.sglang_router_port``), whatever engines stand behind it. It
listens on loopback: everything that posts to it runs in the driver process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from relax.backends.embedded.hosting import Served, serve_in_thread
from relax.engine.router import middleware
from relax.engine.router.router import Router
from relax.utils.flag_slice import FlagSlice

GENERATE_TIMEOUT_S = 600.0
"""How long the run's router waits for one engine's answer to a request (a batched /generate: a share of a
rollout step) when --slime-router-timeout is unset; an engine that does not answer in time fails the request
(the run, without --use-fault-tolerance) in one line naming it. A hung engine that still answers /health is
found only this way: set --slime-router-timeout to the longest a rollout step's share may take (docs/waits.md)."""


MAX_CONNECTIONS = 1024
"""The router's connection pool to the engines when --slime-router-max-connections is unset."""


@dataclass(frozen=True)
class RouterConfig(FlagSlice):
    """The seed's Router Configuration flags that apply to our router (a typed slice of the flags, built by the
    driver with ``RouterConfig.from_args(args)``, relax/utils/flag_slice.py)."""

    # when an engine counts as down, and how long one request to it may take (None: GENERATE_TIMEOUT_S)
    slime_router_health_check_failure_threshold: int
    slime_router_timeout: float | None
    # the connection pool to the engines (None: MAX_CONNECTIONS)
    slime_router_max_connections: int | None
    # --use-fault-tolerance: retry a request on another engine when one fails
    use_fault_tolerance: bool
    # --use-slime-router: the default rollout sends text (relax/engine/rollout/prompt_input.py); its middlewares
    # (relax/engine/router/middleware.py) wrap every request the router sends to one engine
    use_slime_router: bool
    slime_router_middleware_paths: list[str] | None
    # the whole namespace, for the middlewares (slime's read router.args, e.g. --hf-checkpoint's tokenizer)
    args: Any = field(default=None, compare=False, repr=False)

    @property
    def failure_threshold(self) -> int:
        return self.slime_router_health_check_failure_threshold

    @property
    def request_timeout(self) -> float:
        return self.slime_router_timeout or GENERATE_TIMEOUT_S

    @property
    def max_connections(self) -> int:
        return self.slime_router_max_connections or MAX_CONNECTIONS

    @property
    def failover(self) -> bool:
        return self.use_fault_tolerance

    def validate(self) -> None:
        if self.slime_router_health_check_failure_threshold < 1:
            raise ValueError("--slime-router-health-check-failure-threshold must be >= 1, got "
                             f"{self.slime_router_health_check_failure_threshold}")
        if self.slime_router_middleware_paths and not self.use_slime_router:
            raise ValueError("--slime-router-middleware-paths needs --use-slime-router (the middlewares are the text "
                             "router's)")


class RouterThread:
    def __init__(self, worker_urls: list[str], config: RouterConfig, *, worker_api_key: str | None = None):
        self.router = Router(worker_urls, failure_threshold=config.failure_threshold, health_timeout=5.0,
                             request_timeout=config.request_timeout, max_connections=config.max_connections,
                             worker_api_key=worker_api_key, failover=config.failover, remove_unhealthy=False)
        self.router.middlewares = middleware.build(config.slime_router_middleware_paths, self.router, config)
        self.served: Served = serve_in_thread(self.router.app(), "127.0.0.1", name="relax-router")

    @property
    def url(self) -> str:
        return self.served.url

    def add_worker(self, url: str) -> None:
        self.served.call(lambda: self.router.add_worker(url))

    def remove_worker(self, url: str) -> None:
        self.served.call(lambda: self.router.remove_worker(url))

    def drain_worker(self, url: str) -> bool:
        return self.served.call(lambda: self.router.drain_worker(url))

    def outstanding(self, url: str) -> int:
        return self.served.call(lambda: self.router.outstanding(url))

    def workers_info(self) -> list[dict]:
        return self.served.call(lambda: [w.info() for w in self.router.workers.values()])

    def worker_urls(self) -> list[str]:
        return self.served.call(lambda: list(self.router.workers))
