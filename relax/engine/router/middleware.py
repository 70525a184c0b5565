"""``--slime-router-middleware-paths``: user code around each request the run's router sends to one engine.

slime's SlimeRouter runs Starlette ``BaseHTTPMiddleware`` classes (e.g. its radix-tree cache) around the requests
it routes. Our router is aiohttp, whose own middlewares see raw ``web.Request`` objects whose body cannot be
rewritten; so the hook works on small typed objects instead, in the same ``dispatch(request, call_next)`` shape:

    class MyMiddleware:
        def __init__(self, router, config): ...          # the Router and the run's RouterConfig (config.args: the
                                                          # whole namespace, e.g. for --hf-checkpoint's tokenizer)
        async def __call__(self, request: RoutedRequest, call_next) -> RoutedResponse:
            request.json["sampling_params"]["temperature"] = 0.0     # change the request ...
            response = await call_next(request)                      # ... send it on (or answer it yourself) ...
            response.headers["X-Seen"] = "yes"                       # ... and change the answer
            return response

Middlewares run in the order given, the first outermost; each wraps every request the router forwards to one
engine (``/generate`` and any other path it passes through, e.g. SGLang's ``/v1/completions``), not the calls it
broadcasts to every engine (pause, flush, weights) nor its own endpoints (``/list_workers``, ``/health``). A path
that does not import or does not fit the hook fails the launch in one line naming it (`check_paths`).
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from relax.utils.json_codec import JSONDecodeError, dumps, loads
from relax.utils.plugins import PluginError, load_object

FLAG = "--slime-router-middleware-paths"
SIGNATURE = ("class M: __init__(self, router, config); async __call__(self, request: RoutedRequest, call_next) "
             "-> RoutedResponse")


@dataclass
class RoutedRequest:
    """One request on its way to an engine. ``json``: the parsed JSON body (None without one; ``data`` then holds
    the raw bytes); ``routing_key``: pins the request to one engine (the client's ``X-Routing-Key`` header or body
    ``routing_key``, which the router strips from the body); ``engine_headers``: extra headers sent to the engine;
    ``state``: scratch space the middlewares of one request share."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any = None
    data: bytes | None = None
    routing_key: str | None = None
    engine_headers: dict[str, str] = field(default_factory=dict)
    state: dict[str, Any] = field(default_factory=dict)

    def body(self) -> bytes | None:
        return dumps(self.json) if self.json is not None else self.data


@dataclass
class RoutedResponse:
    """The answer (the engine's, or one a middleware or the router made). ``worker``: the engine's URL (None when
    no engine answered); ``headers``: extra headers of the answer to the client."""

    status: int
    json: Any = None
    data: bytes = b""
    worker: str | None = None
    headers: dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_bytes(cls, status: int, data: bytes, worker: str | None = None) -> RoutedResponse:
        try:
            return cls(status, loads(data) if data else None, data, worker)
        except (JSONDecodeError, UnicodeDecodeError):  # SGLang answers a few calls in plain text
            return cls(status, None, data, worker)

    @classmethod
    def error(cls, status: int, message: str) -> RoutedResponse:
        """A one-line error answer in SGLang's shape (e.g. a middleware refusing a request with 400)."""
        return cls(status, {"error": {"message": message, "code": status}})

    def body(self) -> bytes:
        return dumps(self.json) if self.json is not None else self.data


CallNext = Callable[[RoutedRequest], Awaitable[RoutedResponse]]
Middleware = Callable[[RoutedRequest, CallNext], Awaitable[RoutedResponse]]


def load_class(path: str) -> type:
    """The middleware class at ``path``, its hook checked; `PluginError` naming the path otherwise."""
    try:
        cls = load_object(path)
    except PluginError as exc:
        raise PluginError(f"{FLAG}: {exc}; expected {SIGNATURE}") from None
    if not inspect.isclass(cls):
        raise PluginError(f"{FLAG}: {path!r} is a {type(cls).__name__}, not a class; expected {SIGNATURE}")
    _check_arity(path, cls, "__init__", 2)
    call = inspect.getattr_static(cls, "__call__", None)  # the instances' __call__, not the class's (type's)
    if call is None or not inspect.iscoroutinefunction(call):
        raise PluginError(f"{FLAG}: {path!r} has no async __call__; expected {SIGNATURE}")
    _check_arity(path, cls, "__call__", 2)
    return cls


def _check_arity(path: str, cls: type, name: str, wanted: int) -> None:
    try:
        params = list(inspect.signature(getattr(cls, name)).parameters.values())[1:]  # without self
    except (TypeError, ValueError):
        return
    if any(p.kind == p.VAR_POSITIONAL for p in params):
        return
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    required = [p for p in positional if p.default is p.empty]
    if len(positional) < wanted or len(required) > wanted:
        raise PluginError(f"{FLAG}: {path!r}.{name} takes {len(positional)} argument(s) besides self, "
                          f"expected {SIGNATURE}")


def check_paths(paths: list[str] | None) -> None:
    """Launch check: every path imports and fits the hook (the first bad one raises, naming it)."""
    for path in paths or ():
        load_class(path)


def build(paths: list[str] | None, router: Any, config: Any) -> list[tuple[str, Middleware]]:
    """The middlewares, constructed in the order given: ``[(path, instance)]``."""
    return [(path, load_class(path)(router, config)) for path in paths or ()]


def chain(middlewares: list[tuple[str, Middleware]], innermost: CallNext) -> CallNext:
    """``call(request)``: the first middleware, whose ``call_next`` is the second, ... the last's is ``innermost``.
    A middleware that raises answers 500 in one line naming it (the error is the middleware's, not an engine's)."""
    call = innermost
    for path, mw in reversed(middlewares):
        call = _wrap(path, mw, call)
    return call


def _wrap(path: str, mw: Middleware, call_next: CallNext) -> CallNext:
    async def call(request: RoutedRequest) -> RoutedResponse:
        try:
            response = await mw(request, call_next)
        except Exception as exc:  # noqa: BLE001 - a user hook: answer in one line naming it
            first = (str(exc).splitlines() or [""])[0]
            return RoutedResponse.error(500, f"{FLAG} {path} raised {type(exc).__name__}: {first}".rstrip(": "))
        if not isinstance(response, RoutedResponse):
            return RoutedResponse.error(500, f"{FLAG} {path} returned {type(response).__name__}, "
                                             "not a RoutedResponse")
        return response

    return call
