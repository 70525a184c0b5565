"""Middlewares for --slime-router-middleware-paths tests (tests/test_text_router.py): each records what it saw and
leaves a visible mark, so a test can tell they ran, in which order, and what reached the engine."""

from __future__ import annotations

from relax.engine.router.middleware import RoutedRequest, RoutedResponse

SEEN: list[dict] = []  # one entry per request, by Recorder: what went to the engine and what came back


class Recorder:
    """Records each request body the engine gets and the answer it gives; marks the answer ``X-Chain``."""

    def __init__(self, router, config) -> None:
        self.config = config

    async def __call__(self, request: RoutedRequest, call_next) -> RoutedResponse:
        request.state.setdefault("order", []).append("recorder")
        request.engine_headers["X-Order"] = ",".join(request.state["order"])
        sent = dict(request.json or {})
        response = await call_next(request)
        SEEN.append({"path": request.path, "body": sent, "answer": response.json, "worker": response.worker,
                     "order": list(request.state["order"])})
        response.headers["X-Chain"] = ",".join(filter(None, ["recorder", response.headers.get("X-Chain")]))
        return response


class ShortAnswers:
    """Rewrites every /generate to at most 2 new tokens (a visible change of the sampling params)."""

    def __init__(self, router, config) -> None:
        pass

    async def __call__(self, request: RoutedRequest, call_next) -> RoutedResponse:
        request.state.setdefault("order", []).append("short")
        if request.path == "/generate":
            for params in _param_dicts(request.json):
                params["max_new_tokens"] = min(2, params.get("max_new_tokens", 2))
        response = await call_next(request)
        response.headers["X-Chain"] = ",".join(filter(None, ["short", response.headers.get("X-Chain")]))
        return response


class RefuseEmpty:
    """Answers a /generate whose text is empty itself, with 400 (no engine sees it)."""

    def __init__(self, router, config) -> None:
        pass

    async def __call__(self, request: RoutedRequest, call_next) -> RoutedResponse:
        if request.json is not None and request.json.get("text") == "":
            return RoutedResponse.error(400, "empty text")
        return await call_next(request)


class Raises:
    def __init__(self, router, config) -> None:
        pass

    async def __call__(self, request: RoutedRequest, call_next) -> RoutedResponse:
        raise KeyError("no such thing")


class SyncCall:  # wrong hook: __call__ is not async
    def __init__(self, router, config) -> None:
        pass

    def __call__(self, request, call_next):
        return None


class NoConfig:  # wrong hook: __init__ takes the router only
    def __init__(self, router) -> None:
        pass

    async def __call__(self, request, call_next):
        return await call_next(request)


def not_a_class(request, call_next):
    return None


def _param_dicts(body) -> list[dict]:
    params = (body or {}).get("sampling_params")
    if isinstance(params, dict):
        return [params]
    return [p for p in params or [] if isinstance(p, dict)]


class FileRecorder:
    """For a ``relax train`` run (its router lives in the driver process): appends each /generate body and answer
    to the JSON-lines file ``$RELAX_TEST_ROUTER_LOG``."""

    def __init__(self, router, config) -> None:
        import os

        self.path = os.environ["RELAX_TEST_ROUTER_LOG"]
        self.hf_checkpoint = config.args.hf_checkpoint  # the run's namespace reaches the middleware

    async def __call__(self, request: RoutedRequest, call_next) -> RoutedResponse:
        import json

        sent = dict(request.json or {})
        response = await call_next(request)
        if request.path == "/generate":
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps({"body": sent, "answer": response.json, "model": self.hf_checkpoint}) + "\n")
        return response
