"""The embedded engine as an HTTP server speaking SGLang's endpoint subset (DESIGN.md contract).

    python -m relax.backends.embedded.server --hf-checkpoint tiny-qwen3 --port 30000

``--port 0`` picks a free port. Once serving, the process prints one line
``relax-engine ready http://HOST:PORT`` on stdout. It binds 127.0.0.1 unless ``--host`` says
otherwise; a non-loopback host requires ``--api-key``, and with a key every request must carry
``Authorization: Bearer KEY``. Bad input answers 4xx with ``{"error": {"message": ...}}`` and the
server keeps serving. Weight-update payloads are described in `weight_transport`.
"""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import json
import logging
import socket
import sys
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from relax.backends.embedded import weight_transport as wt
from relax.backends.embedded.scheduler import Scheduler
from relax.backends.embedded.weights_checker import WeightsChecker

log = logging.getLogger("relax.engine.server")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
_MAX_BODY = 16 << 30  # weight payloads are large


class BadRequest(ValueError):
    """Client error: answered 400 with the message."""


def error(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message, "code": status}}, status=status)


def fields(body: dict[str, Any], *, required: tuple[str, ...] = (), optional: tuple[str, ...] = ()) -> dict[str, Any]:
    unknown = sorted(set(body) - set(required) - set(optional))
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    missing = [k for k in required if k not in body]
    if missing:
        raise BadRequest(f"missing field(s): {', '.join(missing)}")
    return body


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
            per_item = k in (key, "rid") or (k in ("sampling_params", "return_logprob") and isinstance(v, list))
            if per_item:
                if not isinstance(v, list) or len(v) != n:
                    raise BadRequest(f"batch field {k!r} must be a list of {n}")
                single[k] = v[i]
            else:
                single[k] = v
        out.append(single)
    return out, True


class EngineServer:
    def __init__(self, scheduler: Scheduler, *, api_key: str | None = None, model_path: str = ""):
        self.scheduler = scheduler
        self.engine = scheduler.engine
        self.api_key = api_key
        self.model_path = model_path
        self.checker = WeightsChecker(self.engine.model)
        self.weight_group: wt.WeightGroup | None = None

    # ------------------------------------------------------------------ plumbing
    def app(self) -> web.Application:
        app = web.Application(client_max_size=_MAX_BODY, middlewares=[self._middleware])
        post = {
            "/generate": self.generate, "/abort_request": self.abort_request,
            "/pause_generation": self.pause_generation, "/continue_generation": self.continue_generation,
            "/update_weights_from_tensor": self.update_weights_from_tensor,
            "/update_weights_from_disk": self.update_weights_from_disk,
            "/init_weights_update_group": self.init_weights_update_group,
            "/destroy_weights_update_group": self.destroy_weights_update_group,
            "/update_weights_from_distributed": self.update_weights_from_distributed,
            "/release_memory_occupation": self.release_memory, "/resume_memory_occupation": self.resume_memory,
            "/weights_checker": self.weights_checker,
        }
        for path, handler in post.items():
            app.router.add_post(path, handler)
        both = {"/flush_cache": self.flush_cache, "/get_weight_version": self.get_weight_version,
                "/health": self.health, "/health_generate": self.health_generate,
                "/get_model_info": self.model_info, "/get_server_info": self.server_info}
        for path, handler in both.items():
            app.router.add_get(path, handler)
            app.router.add_post(path, handler)
        return app

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if self.api_key is not None and request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return error(401, "missing or wrong API key (Authorization: Bearer <key>)")
        try:
            return await handler(request)
        except web.HTTPException:
            raise
        except (BadRequest, ValueError) as exc:
            return error(400, str(exc))
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
            data = await request.json()
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"malformed JSON body: {exc}") from None
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise BadRequest("the JSON body must be an object")
        return data

    async def in_thread(self, fn: Callable[[], Any]) -> Any:
        return await asyncio.get_running_loop().run_in_executor(None, fn)

    async def exclusive(self, fn: Callable[[Any], Any]) -> Any:
        """Run ``fn(engine)`` with generation paused around it (off the event loop)."""
        def run() -> Any:
            with self.scheduler.exclusive() as engine:
                return fn(engine)
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
        return web.json_response(list(results) if is_batch else results[0])

    async def abort_request(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), optional=("rid", "abort_all", "finished_reason", "abort_message"))
        if not body.get("abort_all") and not body.get("rid"):
            raise BadRequest("abort_request needs rid or abort_all=true")
        n = self.scheduler.abort(body.get("rid"), abort_all=bool(body.get("abort_all")))
        return web.json_response({"success": True, "num_aborted": n})

    async def pause_generation(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), optional=("mode",))
        mode = body.get("mode", "abort")
        if mode not in ("abort", "in_place", "retract"):
            raise BadRequest(f"pause_generation mode must be abort, in_place or retract, got {mode!r}")
        await self.in_thread(self.scheduler.pause)
        n = self.scheduler.abort(abort_all=True) if mode == "abort" else 0
        return web.json_response({"success": True, "num_aborted": n})

    async def continue_generation(self, request: web.Request) -> web.Response:
        fields(await self.body(request), optional=("torch_empty_cache",))
        self.scheduler.resume()
        return web.json_response({"success": True})

    async def flush_cache(self, request: web.Request) -> web.Response:
        ok = await self.exclusive(lambda e: e.flush_cache())
        return web.json_response({"success": ok, "message": "" if ok else "requests are running"},
                                 status=200 if ok else 400)

    # ------------------------------------------------------------------ weights
    def _apply(self, engine: Any, named: wt.NamedTensors, version: Any) -> dict[str, Any]:
        engine.update_weights_from_tensors(named, version=_version(version))
        return {"success": True, "message": f"updated {len(named)} tensors", "weight_version": engine.weight_version,
                "num_paused_requests": len(engine.running)}

    async def update_weights_from_tensor(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), optional=(
            "serialized_named_tensors", "load_format", "path", "flush_cache", "weight_version", "abort_all_requests"))
        if body.get("abort_all_requests"):
            self.scheduler.abort(abort_all=True)
        fmt = body.get("load_format")
        if fmt == "shm":
            if not isinstance(body.get("path"), str):
                raise BadRequest("load_format 'shm' needs a 'path'")
            named = await self.in_thread(lambda: wt.read_safetensors(body["path"]))
        elif fmt in (None, "torch_save"):
            items = body.get("serialized_named_tensors")
            if not isinstance(items, list):
                raise BadRequest("serialized_named_tensors must be a list of base64 strings")
            named = [pair for item in items for pair in wt.decode_named_tensors(item)]
        else:
            raise BadRequest(f"unsupported load_format {fmt!r} (torch_save or shm)")
        return web.json_response(await self.exclusive(lambda e: self._apply(e, named, body.get("weight_version"))))

    async def update_weights_from_disk(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), required=("model_path",), optional=(
            "load_format", "flush_cache", "weight_version", "abort_all_requests"))
        if body.get("abort_all_requests"):
            self.scheduler.abort(abort_all=True)
        named = await self.in_thread(lambda: wt.read_hf_dir(body["model_path"]))
        result = await self.exclusive(lambda e: self._apply(e, named, body.get("weight_version")))
        self.model_path = body["model_path"]
        return web.json_response(result)

    async def init_weights_update_group(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), required=("master_address", "master_port", "rank_offset",
                                                          "world_size"),
                      optional=("group_name", "backend", "timeout"))
        backend = body.get("backend") or ("nccl" if self.engine.device.type == "cuda" else "gloo")
        rank = int(body["rank_offset"])  # one process per engine: its rank is the offset
        self.weight_group = await self.in_thread(lambda: wt.WeightGroup(
            body["master_address"], int(body["master_port"]), rank, int(body["world_size"]),
            group_name=body.get("group_name", "weight_update_group"), backend=backend,
            timeout_s=float(body.get("timeout", 300))))
        return web.json_response({"success": True, "message": f"joined as rank {rank} ({backend})"})

    async def destroy_weights_update_group(self, request: web.Request) -> web.Response:
        fields(await self.body(request), optional=("group_name",))
        if self.weight_group is not None:
            self.weight_group.close()
        self.weight_group = None
        return web.json_response({"success": True})

    async def update_weights_from_distributed(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), required=("names", "dtypes", "shapes"), optional=(
            "group_name", "flush_cache", "weight_version", "abort_all_requests", "load_format", "torch_empty_cache"))
        group = self.weight_group
        if group is None:
            raise RuntimeError("no weight update group: call /init_weights_update_group first")
        names, dtypes, shapes = body["names"], body["dtypes"], body["shapes"]
        if not len(names) == len(dtypes) == len(shapes):
            raise BadRequest("names, dtypes and shapes must have the same length")
        state = self.engine.model.state_dict()
        unknown = [n for n in names if n not in state]
        if unknown:
            raise BadRequest(f"unknown weight(s): {', '.join(unknown[:5])}")
        if body.get("abort_all_requests"):
            self.scheduler.abort(abort_all=True)
        comm_device = "cuda" if group.backend == "nccl" else "cpu"

        def receive(engine: Any) -> dict[str, Any]:
            buffers = [torch_empty(s, wt.dtype_from_name(d), comm_device) for d, s in zip(dtypes, shapes, strict=True)]
            group.broadcast(buffers, root=0)
            return self._apply(engine, list(zip(names, buffers, strict=True)), body.get("weight_version"))

        return web.json_response(await self.exclusive(receive))

    async def get_weight_version(self, request: web.Request) -> web.Response:
        return web.json_response({"weight_version": self.engine.weight_version})

    async def weights_checker(self, request: web.Request) -> web.Response:
        body = fields(await self.body(request), required=("action",), optional=("seed",))
        kwargs = {"seed": int(body["seed"])} if body["action"] == "reset_tensors" and "seed" in body else {}
        return web.json_response(await self.exclusive(lambda e: self.checker.run(body["action"], **kwargs)))

    # ------------------------------------------------------------------ memory, health, info
    async def release_memory(self, request: web.Request) -> web.Response:
        fields(await self.body(request), optional=("tags",))
        await self.exclusive(lambda e: e.release_memory_occupation())
        return web.json_response({"success": True})

    async def resume_memory(self, request: web.Request) -> web.Response:
        fields(await self.body(request), optional=("tags",))
        await self.exclusive(lambda e: e.resume_memory_occupation())
        return web.json_response({"success": True})

    async def health(self, request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def health_generate(self, request: web.Request) -> web.Response:
        if self.scheduler.paused or self.engine.released:
            return web.json_response({"status": "ok", "generated": False})
        fut = self.scheduler.submit({"input_ids": [1], "sampling_params": {"max_new_tokens": 1, "temperature": 0.0}})
        try:
            await asyncio.wait_for(asyncio.wrap_future(fut), timeout=60)
        except TimeoutError:
            return error(503, "engine did not generate a token within 60 s")
        return web.json_response({"status": "ok", "generated": True})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.model_path, "is_generation": True,
                                  "max_context_len": self.engine.max_context_len,
                                  "vocab_size": int(self.engine.model.config.vocab_size)})

    async def server_info(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response({"model_path": self.model_path, "device": str(e.device), "weight_version": e.weight_version,
                                  "max_context_len": e.max_context_len, "max_running_requests": e.max_running_requests,
                                  "running": len(e.running), "waiting": len(e.waiting), "paused": self.scheduler.paused,
                                  "released": e.released, "steps": self.scheduler.steps})


def torch_empty(shape: list[int], dtype: Any, device: str) -> Any:
    import torch

    return torch.empty([int(x) for x in shape], dtype=dtype, device=device)


def _version(v: Any) -> int | None:
    if v is None:
        return None
    try:
        return int(v)
    except (TypeError, ValueError):
        raise BadRequest(f"weight_version must be an integer, got {v!r}") from None


# ---------------------------------------------------------------------- process entry
def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


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
    p.add_argument("--num-threads", type=int, default=1, help="torch intra-op threads (CPU)")
    p.add_argument("--log-level", default="WARNING")
    args = p.parse_args(argv)
    if not args.hf_checkpoint and not args.model_config_json:
        p.error("one of --hf-checkpoint or --model-config-json is required")
    if not is_loopback(args.host) and not args.api_key:
        p.error(f"--host {args.host} is not loopback: --api-key is required")
    return args


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
        family = {"qwen3": "Qwen3", "qwen2": "Qwen2", "llama": "Llama"}[spec.get("family", "qwen3")]
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
                          overlap=None if args.overlap == "auto" else args.overlap == "on")


async def serve(server: EngineServer, host: str, port: int) -> None:
    runner = web.AppRunner(server.app(), access_log=None, handler_cancellation=True)
    await runner.setup()
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
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
    engine = build_engine(args)
    server = EngineServer(Scheduler(engine), api_key=args.api_key,
                          model_path=args.hf_checkpoint or args.model_config_json)
    try:
        asyncio.run(serve(server, args.host, args.port))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
