"""``python -m relax.engine.router``: run the router (see `relax.engine.router.router`)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys

from aiohttp import web

from relax.engine.router import middleware
from relax.engine.router.in_process import RouterConfig
from relax.engine.router.router import Router


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m relax.engine.router", description="Router in front of engine servers")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    p.add_argument("--worker-urls", nargs="*", default=[], help="engine server URLs (more via /add_worker)")
    p.add_argument("--slime-router-health-check-failure-threshold", type=int, default=3,
                   help="remove a worker after this many consecutive failed health checks")
    p.add_argument("--health-check-interval", type=float, default=1.0, help="seconds between health checks")
    p.add_argument("--health-check-timeout", type=float, default=2.0, help="seconds one health check may take")
    p.add_argument("--slime-router-timeout", type=float, default=None, help="per-request timeout to a worker (s)")
    p.add_argument("--slime-router-max-connections", type=int, default=1024)
    p.add_argument("--slime-router-middleware-paths", nargs="*", default=[],
                   help="middleware classes M(router, config), run in this order around each routed request "
                        "(relax/engine/router/middleware.py; config: this router's flags, config.args all of them)")
    p.add_argument("--api-key", default=None, help="required from clients; needed for a non-loopback --host")
    p.add_argument("--worker-api-key", default=None, help="sent to the workers")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    from relax.backends.embedded.hosting import is_loopback

    if not is_loopback(args.host) and not args.api_key:
        p.error(f"--host {args.host} is not loopback: --api-key is required")
    from relax.utils.plugins import PluginError

    for path in args.slime_router_middleware_paths:
        try:
            middleware.load_class(path)
        except PluginError as exc:
            p.error(str(exc))
    return args


async def serve(router: Router, host: str, port: int) -> None:
    runner = web.AppRunner(router.app(), access_log=None)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    await web.SockSite(runner, sock).start()
    shown = f"[{host}]" if ":" in host else host
    print(f"relax-router ready http://{shown}:{sock.getsockname()[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    router = Router(args.worker_urls, failure_threshold=args.slime_router_health_check_failure_threshold,
                    health_interval=args.health_check_interval, health_timeout=args.health_check_timeout,
                    request_timeout=args.slime_router_timeout, max_connections=args.slime_router_max_connections,
                    api_key=args.api_key, worker_api_key=args.worker_api_key)
    config = RouterConfig(  # what a run's middleware gets, from this router's flags (it always fails over)
        slime_router_health_check_failure_threshold=args.slime_router_health_check_failure_threshold,
        slime_router_timeout=args.slime_router_timeout, slime_router_max_connections=args.slime_router_max_connections,
        use_fault_tolerance=True, use_slime_router=True,
        slime_router_middleware_paths=args.slime_router_middleware_paths, args=args)
    router.middlewares = middleware.build(args.slime_router_middleware_paths, router, config)
    try:
        asyncio.run(serve(router, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
