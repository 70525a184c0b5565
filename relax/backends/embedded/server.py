"""The embedded engine as an HTTP server speaking SGLang's endpoint subset (DESIGN.md contract).

    python -m relax.backends.embedded.server --hf-checkpoint tiny-qwen3 --port 30000

``--port 0`` picks a free port. Once serving, the process prints one line
``relax-engine ready http://HOST:PORT`` on stdout. It binds 127.0.0.1 unless ``--host`` says
otherwise; a non-loopback host requires ``--api-key``, and with a key every request must carry
``Authorization: Bearer KEY``. Bad input answers 4xx with ``{"error": {"message": ...}}`` and the
server keeps serving. Request bodies are checked against SGLang's fields (`relax.engine.protocol`); the
weight endpoints are `weight_routes`; docs/engine_api.md lists every endpoint and field.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import torch
from aiohttp import web

import relax
from relax.backends.embedded.hosting import is_loopback
from relax.backends.embedded.scheduler import Scheduler
from relax.backends.embedded.weight_routes import WeightRoutes
from relax.backends.embedded.weights_checker import ACTIONS
from relax.engine.protocol import ENDPOINTS_BY_PATH, PAUSE_MODES, check_fields
from relax.utils.json_codec import JSONDecodeError, json_response, loads
from relax.weights.devices import device_identity

log = logging.getLogger("relax.engine.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MAX_BODY = 16 << 30  # weight payloads are large
HEALTH_GENERATE_TIMEOUT_S = 60
FLUSHED = ("Cache flushed.\nPlease check backend logs for more details. (When there are running or waiting requests, "
           "the operation will not be performed.)\n")  # SGLang's /flush_cache text


class BadRequest(ValueError):
    """Client error: answered 400 with the message."""


def error(status: int, message: str) -> web.Response:
    return json_response({"error": {"message": message, "code": status}}, status=status)


# SGLang's /generate batch: lists of input_ids / text (and rid); these may be lists of per-item values too
_PER_ITEM = ("sampling_params", "return_logprob", "logprob_start_len", "top_logprobs_num")
_MEDIA = ("image_data", "video_data", "audio_data")


def split_generate(body: dict[str, Any]) -> tuple[list[dict[str, Any]], bool]:
    """A /generate body -> (single requests, is_batch); SGLang batches are lists of input_ids/text."""
    key = "input_ids" if "input_ids" in body else "text"
    first = body.get(key)
    is_batch = isinstance(first, list) and (key == "text" or (bool(first) and isinstance(first[0], list)))
    if not is_batch:
        return [body], False
    n = len(first)
    out = []
    for i in range(n):
        single = {}
        for k, v in body.items():
            # image_data / video_data / audio_data in a batch: one entry per item (an item or a list of them), as SGLang has it
            if k in (key, "rid") or (k in _PER_ITEM and isinstance(v, list)) or (k in _MEDIA and v is not None):
                if not isinstance(v, list) or len(v) != n:
                    raise BadRequest(f"batch field {k!r} must be a list of {n}")
                single[k] = v[i]
            else:
                single[k] = v
        out.append(single)
    return out, True


# The fields this server implements, per control endpoint (weight endpoints: weight_routes.IMPLEMENTED;
# /generate: engine.IMPLEMENTED_REQUEST_FIELDS and sampling.IMPLEMENTED); docs/engine_api.md lists them.
IMPLEMENTED: dict[str, frozenset[str]] = {
    "/abort_request": frozenset({"rid", "abort_all", "abort_message"}),
    "/pause_generation": frozenset({"mode"}),
    "/continue_generation": frozenset({"torch_empty_cache"}),
    "/flush_cache": frozenset(),
    "/release_memory_occupation": frozenset({"tags"}),
    "/resume_memory_occupation": frozenset({"tags"}),
    "/start_profile": frozenset({"output_dir", "num_steps", "activities", "with_stack", "record_shapes",
                                 "profile_prefix"}),  # profiling.py; profile_by_stage: one trace per session
}


def _checked(path: str, body: dict[str, Any]) -> dict[str, Any]:
    check_fields(body, ENDPOINTS_BY_PATH[path].fields, IMPLEMENTED[path], path.lstrip("/"))
    return body


class EngineServer:
    """SGLang's HTTP API over one `Scheduler` (continuous batching over an `EmbeddedEngine`)."""

    def __init__(self, scheduler: Scheduler, *, api_key: str | None = None, model_path: str = "",
                 checksum_layout: str = "relax"):
        self.scheduler = scheduler
        self.engine = scheduler.engine
        self.api_key = api_key
        self.model_path = model_path
        self.never_generates = False  # a planted fault (relax/utils/fault_hooks.py engine_unhealthy)
        self.weights = WeightRoutes(self.engine, body=self.body, run=self.exclusive,
                                    abort_all=lambda: self.scheduler.abort(abort_all=True),
                                    checksum_layout=checksum_layout)

    # ------------------------------------------------------------------ plumbing
    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY, middlewares=[self._middleware])
        for path in ("/generate", "/abort_request", "/pause_generation", "/continue_generation"):
            app.router.add_post(path, getattr(self, path.lstrip("/")))
        app.router.add_put("/generate", self.generate)
        self.weights.add_to(app)
        get_and_post = {"/flush_cache": self.flush_cache, "/release_memory_occupation": self.release_memory,
                        "/resume_memory_occupation": self.resume_memory,
                        "/start_profile": self.start_profile, "/stop_profile": self.stop_profile}
        for path, handler in get_and_post.items():
            app.router.add_get(path, handler)
            app.router.add_post(path, handler)
        gets = {"/health": self.health, "/health_generate": self.health_generate, "/model_info": self.model_info,
                "/get_model_info": self.model_info, "/server_info": self.server_info,
                "/get_server_info": self.server_info}
        for path, handler in gets.items():
            app.router.add_get(path, handler)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return error(401, "missing or wrong API key (Authorization: Bearer <key>)")
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (BadRequest, ValueError, KeyError) as exc:
            return error(400, str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc))  # KeyError quotes
        except RuntimeError as exc:  # a state conflict: released, busy, no group
            return error(409, str(exc))
        except Exception as exc:
            log.exception("handler %s failed", request.path)
            return error(500, f"{type(exc).__name__}: {exc}")

    @staticmethod
    async def body(request: web.Request) -> dict[str, Any]:
        if not request.can_read_body:
            return {}
        try:
            raw = await request.read()
            data = loads(raw) if raw.strip() else None
        except (JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"malformed JSON body: {exc}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise BadRequest("the JSON body must be an object")
        return data

    async def in_thread(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def exclusive(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn()`` with generation held off between two decode steps (off the event loop)."""
        def run() -> Any:
            with self.scheduler.exclusive():
                return fn()
        return await self.in_thread(run)

    # ------------------------------------------------------------------ generation
    async def generate(self, request: web.Request) -> web.Response:
        singles, is_batch = split_generate(await self.body(request))
        futures = self.scheduler.submit_many(singles)
        try:
            results = await asyncio.gather(*(asyncio.wrap_future(f) for f in futures))
        except asyncio.CancelledError:  # the client went away: free its rows
            for f in futures:  # (gather cancelled the futures; finished rids are no-ops)
                self.scheduler.abort(f.rid)
            raise
        return json_response(list(results) if is_batch else results[0])

    async def abort_request(self, request: web.Request) -> web.Response:
        body = _checked("/abort_request", await self.body(request))
        if not body.get("abort_all") and not body.get("rid"):
            return web.Response(status=200)  # SGLang ignores an abort that names nothing (empty 200)
        self.scheduler.abort(body.get("rid"), abort_all=bool(body.get("abort_all")),
                             message=body.get("abort_message"))
        return web.Response(status=200)  # SGLang answers an empty 200

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = _checked("/pause_generation", await self.body(request))
        mode = body.get("mode", "abort")
        if mode not in PAUSE_MODES:
            raise BadRequest(f"pause_generation mode must be one of {', '.join(PAUSE_MODES)}, got {mode!r}")
        if mode == "retract":
            raise BadRequest("pause_generation mode 'retract' is not implemented by this engine (abort or in_place)")
        await self.in_thread(self.scheduler.pause)
        if mode == "abort":
            self.scheduler.abort(abort_all=True)
        return json_response({"message": "Generation paused successfully.", "status": "ok"})

    async def continue_generation(self, request: web.Request) -> web.Response:
        """``torch_empty_cache`` (SGLang 0.5.14's, on by default): empty the CUDA cache before un-pausing."""
        body = _checked("/continue_generation", await self.body(request))
        if body.get("torch_empty_cache", True) and self.engine.device.type == "cuda":
            await self.in_thread(torch.cuda.empty_cache)
        self.scheduler.resume()
        return json_response({"message": "Generation continued successfully.", "status": "ok"})

    async def flush_cache(self, request: web.Request) -> web.Response:
        """Nothing is cached across requests (no prefix cache): succeeds when idle, as SGLang's does."""
        _checked("/flush_cache", await self.body(request))
        if request.query.get("timeout") not in (None, "0", "0.0"):
            raise BadRequest("flush_cache ?timeout= is not implemented by this engine (it flushes at once or refuses)")
        ok = await self.exclusive(self.engine.flush_cache)
        return web.Response(text=FLUSHED if ok else "Cache not flushed: requests are running.\n",
                            status=200 if ok else 400)

    # ------------------------------------------------------------------ profiling (profiling.py)
    async def start_profile(self, request: web.Request) -> web.Response:
        body = _checked("/start_profile", await self.body(request))
        text = await asyncio.wrap_future(self.scheduler.profile("start", body))
        return web.Response(text=text, status=200)

    async def stop_profile(self, request: web.Request) -> web.Response:
        text = await asyncio.wrap_future(self.scheduler.profile("stop"))
        return web.Response(text=text, status=200)

    # ------------------------------------------------------------------ memory, health, info
    async def release_memory(self, request: web.Request) -> web.Response:
        body = _checked("/release_memory_occupation", await self.body(request))
        await self.exclusive(lambda: self.engine.release_memory_occupation(body.get("tags")))
        return json_response(None)

    async def resume_memory(self, request: web.Request) -> web.Response:
        body = _checked("/resume_memory_occupation", await self.body(request))
        await self.exclusive(lambda: self.engine.resume_memory_occupation(body.get("tags")))
        return json_response(None)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def health_generate(self, request: web.Request) -> web.Response:
        """One token when idle (SGLang's: generating anything counts); paused or released: up, not generating."""
        if self.never_generates:
            return error(503, "engine does not generate (injected fault RELAX_FAULT_ENGINE_UNHEALTHY)")
        if self.scheduler.paused or self.engine.released or self.scheduler.num_outstanding():
            return web.Response(status=200)
        fut = self.scheduler.submit({"input_ids": [0], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), timeout=HEALTH_GENERATE_TIMEOUT_S)
        except TimeoutError:
            return error(503, f"engine did not generate a token within {HEALTH_GENERATE_TIMEOUT_S} s")
        return web.Response(status=200)

    async def model_info(self, request: web.Request) -> web.Response:
        config = self.engine.model.config
        return json_response({
            "model_path": self.model_path, "tokenizer_path": self.model_path, "is_generation": True,
            "preferred_sampling_params": None, "weight_version": str(self.engine.weight_version),
            "has_image_understanding": False, "has_audio_understanding": False,
            "model_type": getattr(config, "model_type", None), "architectures": getattr(config, "architectures", None),
        })

    async def server_info(self, request: web.Request) -> web.Response:
        """SGLang's keys where they apply, and the embedded engine's own state under ``relax_engine``."""
        e = self.engine
        return json_response({
            "model_path": self.model_path, "tp_size": 1, "weight_version": str(e.weight_version),
            "context_length": e.max_context_len, "max_running_requests": e.max_running_requests,
            "version": f"relax-embedded {relax.__version__}", "kv_events": None,  # SGLang's: None, not publishing
            "relax_engine": {"device": device_identity(e.device), "weights_checker_actions": list(ACTIONS),
                             "running": len(e.running), "waiting": len(e.waiting), "paused": self.scheduler.paused,
                             "released": sorted(e.released_tags), "steps": self.scheduler.steps},
        })


# ---------------------------------------------------------------------- process entry
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m relax.backends.embedded.server", description=__doc__.split("\n")[0])
    p.add_argument("--hf-checkpoint", help="model preset name or local HF directory (relax.models)")
    p.add_argument("--model-config-json", help="alternative to --hf-checkpoint: a JSON file with "
                   "{'family': 'qwen3', 'config': {...}} for a random-init model (no tokenizer)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000, help="0 picks a free port")
    p.add_argument("--api-key", default=None, help="required for a non-loopback --host")
    p.add_argument("--seed", type=int, default=1234, help="random-init seed of a preset model")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--max-context-len", type=int, default=None)
    p.add_argument("--max-running-requests", type=int, default=256)
    p.add_argument("--runner", default="hf", choices=("hf", "static", "lean"),
                   help="hf (HF modules, DynamicCache), static (HF modules, preallocated slots) or lean "
                        "(own fused decoder forward over the model's weights; the fast GPU path)")
    p.add_argument("--cuda-graph", action="store_true",
                   help="static/lean runner on CUDA: capture decode steps (lean: with sampling) as CUDA graphs")
    p.add_argument("--compile", action="store_true",
                   help="lean runner: torch.compile the decode forward before graph capture (slower start)")
    p.add_argument("--overlap", choices=("auto", "on", "off"), default="auto",
                   help="launch decode step t+1 before reading step t's tokens (auto: on for CUDA)")
    p.add_argument("--enable-weights-cpu-backup", action="store_true",
                   help="SGLang's flag: /release_memory_occupation keeps the weights (pinned host copies) instead of "
                        "discarding them; without it a resume must be followed by a sync of every weight")
    p.add_argument("--weights-checker-layout", choices=("relax", "sglang"), default="relax",
                   help="what /weights_checker checksum reports per rank: relax's checksums of HF-named tensors, or "
                        "sglang: a stock SGLang 0.5.14 server's hashes of its fused parameters (to test the "
                        "trainer's read-back of stock servers without one)")
    p.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads (CPU)")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    if not args.hf_checkpoint and not args.model_config_json:
        p.error("one of --hf-checkpoint or --model-config-json is required")
    if not is_loopback(args.host) and not args.api_key:
        p.error(f"--host {args.host} is not loopback: --api-key is required")
    return args


class StartupError(Exception):
    """A serve-engine start-up failure: one line, exit 2 (`main`)."""


def check_model(args: argparse.Namespace) -> None:
    """The checkpoint (a preset, or a directory with every weight file complete) or the config JSON, before
    anything loads: one `StartupError` naming the flag and what is wrong."""
    from pathlib import Path

    from relax.models.registry import PRESETS
    from relax.utils.file_checks import hf_dir_problems

    if args.hf_checkpoint:
        if args.hf_checkpoint in PRESETS:
            return
        path = Path(args.hf_checkpoint)
        if not path.is_dir():
            raise StartupError(f"--hf-checkpoint {args.hf_checkpoint!r} is neither a model preset nor an existing "
                               f"directory; presets: {', '.join(PRESETS)}")
        problems = hf_dir_problems(path, needs_model=True)
        if problems:
            raise StartupError(f"--hf-checkpoint {args.hf_checkpoint}: {'; '.join(problems)}")
        return
    try:
        spec = json.loads(Path(args.model_config_json).read_text())
    except OSError as exc:
        raise StartupError(f"--model-config-json {args.model_config_json}: {exc.strerror}") from None
    except ValueError as exc:
        raise StartupError(f"--model-config-json {args.model_config_json}: not JSON ({exc})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("config"), dict):
        raise StartupError(f"--model-config-json {args.model_config_json}: expected an object with a \"config\" object")
    if spec.get("family", "qwen3") not in FAMILIES:
        raise StartupError(f"--model-config-json {args.model_config_json}: family {spec.get('family')!r} is not one "
                           f"of {', '.join(FAMILIES)}")


def bind(host: str, port: int) -> socket.socket:
    """The listening socket, bound before the model loads: a bad or busy port fails in one line, in milliseconds."""
    if not 0 <= port <= 65535:
        raise StartupError(f"--port {port}: a TCP port is 0-65535 (0 picks a free one)")
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"--host {host} --port {port}: cannot listen there ({exc.strerror})") from None
    return sock


FAMILIES = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}


def build_engine(args: argparse.Namespace):
    import torch

    from relax.backends.embedded.engine import EmbeddedEngine

    torch.set_num_threads(args.num_threads)
    device = args.device if args.device != "auto" else ("cuda" if torch.cuda.is_available() else "cpu")
    dtype = getattr(torch, args.dtype)
    tokenizer = None
    if args.hf_checkpoint:
        from relax.models import build_model, load_tokenizer

        model = build_model(args.hf_checkpoint, dtype=dtype, seed=args.seed)
        tokenizer = load_tokenizer(args.hf_checkpoint)
    else:
        import transformers

        spec = json.loads(open(args.model_config_json).read())
        family = FAMILIES[spec.get("family", "qwen3")]
        cfg = getattr(transformers, f"{family}Config")(**spec["config"])
        cfg._attn_implementation = spec.get("attn_implementation", "eager")
        torch.manual_seed(args.seed)
        model = getattr(transformers, f"{family}ForCausalLM")(cfg).to(dtype)
    eos = {t for t in (getattr(tokenizer, "eos_token_id", None), model.config.eos_token_id) if isinstance(t, int)}
    if isinstance(model.config.eos_token_id, list):
        eos |= set(model.config.eos_token_id)
    return EmbeddedEngine(model, eos_token_ids=sorted(eos), device=device, max_context_len=args.max_context_len,
                          tokenizer=tokenizer, max_running_requests=args.max_running_requests,
                          runner=args.runner, cuda_graph=args.cuda_graph, compile=args.compile,
                          overlap=None if args.overlap == "auto" else args.overlap == "on",
                          weights_cpu_backup=args.enable_weights_cpu_backup)


async def serve(server: EngineServer, host: str, sock: socket.socket) -> None:
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    site = web.SockSite(runner, sock)
    await site.start()
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    print(f"relax-engine ready http://{shown}:{bound}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        server.scheduler.close()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        sock = bind(args.host, args.port)
        check_model(args)
    except StartupError as exc:
        print(f"relax serve-engine: {exc}", file=sys.stderr)
        return 2
    engine = build_engine(args)
    server = EngineServer(Scheduler(engine), api_key=args.api_key,
                          model_path=args.hf_checkpoint or args.model_config_json,
                          checksum_layout=args.weights_checker_layout)
    try:
        asyncio.run(serve(server, args.host, sock))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
