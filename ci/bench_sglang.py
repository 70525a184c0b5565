"""The ``sglang`` runner of ci/bench_engine.py: the same decode workload through a real SGLang server.

    python3 ci/bench_engine.py --runners lean+graph+compile sglang --batches 64 256 --no-hf   # needs sglang 0.5.14
    RELAX_SGLANG_PYTHONPATH=/tmp/sglsite python3 ci/bench_engine.py ...   # sglang in a site dir of its own

What it measures, so that its row reads like the embedded rows beside it:

* **Model**: the bench's random-init preset built exactly as the embedded rows build it
  (`relax.models.build_model`, ``seed=0``, bf16), written as an HF checkpoint dir (`relax.models.save_hf`: safetensors,
  config, the preset's tokenizer) under ``--sglang-model-dir``: the same weights, bit for bit.
* **Server**: started as ``relax train --rollout-backend sglang`` starts one (`relax.backends.sglang.launcher`'s
  `launch_command` and `server_env`: ``RELAX_SGLANG_PYTHONPATH`` first on its path, bf16, seed 0), with what this
  machine needs (``--attention-backend`` triton or flashinfer, never fa3; ``--sampling-backend pytorch``;
  ``--grammar-backend none``) and decode CUDA graphs ON up to the largest batch (``--cuda-graph-max-bs-decode`` and
  ``--max-running-requests`` = max ``--batches``, so no row is split or padded past its size); prefill CUDA graphs
  off (``--disable-prefill-cuda-graph``, as the sglang_colocate run), the context ``--prompt + --new + 8`` tokens as
  the embedded rows'. One server serves every batch, started after the other runners' rows (its idle scheduler
  must not share the machine with them) and stopped in every path: a ``finally`` that ends its process group
  (SIGTERM, 30 s, SIGKILL), a SIGTERM handler so a ``timeout`` reaches that ``finally``, and PR_SET_PDEATHSIG so
  the server dies with this process even when it is killed outright.
* **Requests**: the rows' own prompts and sampling (`ci.bench_engine.engine_requests`: token ids in, temperature 1,
  ``max_new_tokens = --new``, a ``sampling_seed`` per row, ``return_logprob``), plus ``ignore_eos`` (the embedded
  rows run with no EOS ids), sent as the rollout sends them: `HttpEnginePool.generate_batch` over an
  `EngineClient`, which with one engine is ONE batched ``/generate`` (``--sglang-requests batched``, default);
  ``concurrent`` sends one ``/generate`` per row at once instead (`EngineClient.generate` on the list).
* **Time**: a warm-up of 4 rows x 8 tokens and one full batch, then ``--repeats`` timed batches; a wall is from the
  request going out to the last response in, prefill of the batch's prompts, HTTP and detokenization included,
  as an embedded row's wall covers its whole ``generate`` (prefill included). tok/s = batch x ``--new`` / median
  wall. ``server_s``: SGLang's own ``meta_info.e2e_latency`` (the slowest request's) of each timed run; the wall
  minus it is the HTTP path's share. Every response must carry exactly ``--new`` tokens, or the row is an error.
* **Mismatch**: mean/max |SGLang's log-prob - the bench's model's| over the last timed batch, as for engine rows.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SGLANG = "sglang"
ATTENTION_BACKENDS = ("triton", "flashinfer")  # never fa3: the carried sgl_kernel has no FA3 (ci/wheelhouse)
REQUEST_MODES = ("batched", "concurrent")
WARMUP_ROWS, WARMUP_NEW = 4, 8
STOP_WAIT_S = 30.0


def add_arguments(ap: argparse.ArgumentParser) -> None:
    g = ap.add_argument_group("sglang runner", "the sglang row (ci/bench_sglang.py)")
    g.add_argument("--sglang-attention-backend", default="triton", choices=ATTENTION_BACKENDS)
    g.add_argument("--sglang-mem-fraction-static", type=float, default=0.3,
                   help="SGLang's --mem-fraction-static (0.3 of an H200 holds ~40 GiB of KV cache)")
    g.add_argument("--sglang-requests", default="batched", choices=REQUEST_MODES,
                   help="batched: one /generate for the batch, as the rollout's HttpEnginePool sends it; "
                        "concurrent: one /generate per row, all at once")
    g.add_argument("--sglang-startup-timeout", type=float, default=420.0,
                   help="seconds for the server to answer /health_generate (it captures its CUDA graphs first)")
    g.add_argument("--sglang-model-dir", default="/tmp/bench_engine_sglang_model",
                   help="where the HF checkpoint the server loads is written")
    g.add_argument("--sglang-log", default="/tmp/bench_engine_sglang_server.log", help="the server's output")


def check_arguments(ns: argparse.Namespace) -> str | None:
    """Why these arguments cannot run the sglang runner (None: they can)."""
    if SGLANG not in ns.runners:
        return None
    if ns.device != "cuda":
        return "--device cpu: the sglang runner serves on a CUDA GPU"
    if not 0 < ns.sglang_mem_fraction_static < 1:
        return "--sglang-mem-fraction-static must be in (0, 1)"
    if ns.sglang_startup_timeout <= 0:
        return "--sglang-startup-timeout must be > 0"
    return None


# ---------------------------------------------------------------------------------------------- the server
def server_passthrough(ns: argparse.Namespace) -> dict[str, Any]:
    """SGLang options beyond what relax's launcher sets (`launch_command`), as ``--sglang-*`` dests."""
    max_bs = max(ns.batches)
    return {"attention_backend": ns.sglang_attention_backend, "sampling_backend": "pytorch",
            "grammar_backend": "none", "disable_prefill_cuda_graph": True, "cuda_graph_max_bs_decode": max_bs,
            "max_running_requests": max_bs, "context_length": ns.prompt + ns.new + 8, "log_level": "info"}


def server_command(ns: argparse.Namespace, model_dir: str, port: int, nccl_port: int) -> list[str]:
    """``python -m sglang.launch_server ...`` as relax's launcher builds it, with this bench's options."""
    from relax.backends.sglang.config import SGLangLaunchConfig
    from relax.backends.sglang.launcher import launch_command

    cfg = SGLangLaunchConfig(hf_checkpoint=model_dir, output_dir=str(Path(model_dir).parent), train_backend="megatron",
                             bf16=True, seed=0, rollout_num_gpus_per_engine=1, offload_rollout=False,
                             sglang_mem_fraction_static=ns.sglang_mem_fraction_static,
                             sglang_passthrough=server_passthrough(ns))
    return launch_command(cfg, engine_index=0, host="127.0.0.1", port=port, nccl_port=nccl_port, api_key=None)


def _die_with_parent(libc: Any) -> Callable[[], None]:
    """What the server's process runs before exec: its own process group (ended as a whole by `Server.stop`) and
    SIGKILL when this bench process dies (Linux's PR_SET_PDEATHSIG; SGLang's own children follow their parent).
    ``libc`` is loaded before the fork: the child only calls into it."""

    def preexec() -> None:
        os.setsid()
        if libc is not None:
            libc.prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG

    return preexec


class Server:
    """One server process (group): started by `start`, ready after `wait_ready`, ended by `stop` (idempotent)."""

    def __init__(self, command: list[str], env: dict[str, str], log: Path, url: str):
        self.command, self.env, self.log, self.url = command, env, Path(log), url
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        try:
            libc = ctypes.CDLL(None) if sys.platform == "linux" else None
        except OSError:
            libc = None
        with self.log.open("w") as fh:
            self.proc = subprocess.Popen(self.command, stdout=fh, stderr=subprocess.STDOUT, env=self.env,
                                         preexec_fn=_die_with_parent(libc))

    def wait_ready(self, timeout: float, path: str = "/health_generate", poll_s: float = 1.0) -> float:
        """Seconds until ``path`` answered 200; RuntimeError (one line, the log's last line) otherwise."""
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with {self.proc.returncode} before serving: {self.log_tail()}")
            try:
                left = max(1.0, timeout - (time.monotonic() - t0))
                with urllib.request.urlopen(f"{self.url}{path}", timeout=min(30.0, left)) as resp:
                    if resp.status == 200:
                        return time.monotonic() - t0
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(poll_s)
        raise RuntimeError(f"SGLang server not healthy within {timeout:g} s (--sglang-startup-timeout): "
                           f"{self.log_tail()}")

    def log_tail(self) -> str:
        try:
            lines = [line for line in self.log.read_text(errors="replace").splitlines() if line.strip()]
        except OSError:
            return f"(no log at {self.log})"
        return f"{lines[-1].strip()[:200]} (log: {self.log})" if lines else f"(empty log {self.log})"

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_WAIT_S), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


@contextmanager
def running(server: Server, timeout: float) -> Iterator[float]:
    """The server up and healthy (yields its start seconds); stopped on the way out, a SIGTERM included."""
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # `timeout` sends SIGTERM: unwind through `finally`
    try:
        server.start()
        yield server.wait_ready(timeout)
    finally:
        server.stop()
        signal.signal(signal.SIGTERM, previous)


# ---------------------------------------------------------------------------------------------- requests
def sglang_requests(requests: list[dict]) -> list[dict]:
    """The embedded rows' requests (`ci.bench_engine.engine_requests`) with ``ignore_eos``: every row decodes
    ``max_new_tokens``, as the embedded engine does with no EOS ids."""
    return [dict(r, sampling_params=dict(r["sampling_params"], ignore_eos=True)) for r in requests]


async def send(client: Any, requests: list[dict], mode: str) -> list[dict]:
    """The batch through ``/generate``: as the rollout sends it (one batched request per engine), or one per row."""
    from relax.engine.rollout.engine_pool import HttpEnginePool

    if mode == "batched":
        return await HttpEnginePool(client).generate_batch(requests, group_size=1)
    return await client.generate(requests)


def check_lengths(responses: list[dict], new: int) -> None:
    lengths = sorted({len(r["output_ids"]) for r in responses})
    if lengths != [new]:
        raise RuntimeError(f"SGLang returned {lengths[0]}..{lengths[-1]} tokens per row, not --new {new} "
                           "(ignore_eos not honoured?)")


def server_seconds(responses: list[dict]) -> float | None:
    """SGLang's own time for the batch: the slowest request's ``meta_info.e2e_latency``."""
    latencies = [r.get("meta_info", {}).get("e2e_latency") for r in responses]
    latencies = [x for x in latencies if isinstance(x, int | float)]
    return max(latencies) if latencies else None


async def timed_batches(client: Any, warmup: list[dict], requests: list[dict], new: int, repeats: int,
                        mode: str) -> tuple[list[float], list[float | None], list[dict]]:
    """(walls, SGLang's own seconds, the last responses) of ``repeats`` timed batches after two warm-ups."""
    await send(client, warmup, mode)
    check_lengths(await send(client, requests, mode), new)
    walls, server_s, responses = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        responses = await send(client, requests, mode)
        walls.append(time.perf_counter() - t0)
        check_lengths(responses, new)
        server_s.append(server_seconds(responses))
    return walls, server_s, responses


# ---------------------------------------------------------------------------------------------- the rows
def ratios(rows: list[Any], skip: tuple[str, ...]) -> dict[int, dict[str, float]]:
    """``{batch: {runner: runner tok/s / SGLang tok/s}}`` for every row beside an SGLang row that measured;
    runners in ``skip`` (HF generate) are left out."""
    sglang = {r.batch: r.tokens_per_s for r in rows if r.runner == SGLANG and r.tokens_per_s}
    out: dict[int, dict[str, float]] = {}
    for r in rows:
        if r.runner != SGLANG and r.runner not in skip and r.tokens_per_s and r.batch in sglang:
            out.setdefault(r.batch, {})[r.runner] = r.tokens_per_s / sglang[r.batch]
    return out


def ratio_lines(table: dict[int, dict[str, float]]) -> list[str]:
    return [f"{runner} / SGLang at batch {batch}: {ratio:.2f}x" for batch, per in table.items()
            for runner, ratio in per.items()]


def measure_rows(ns: argparse.Namespace, row_class: type, workload: Callable, mismatch: Callable,
                 command: Callable[[argparse.Namespace, str, int, int], list[str]] = server_command,
                 log: Callable[[str], None] = print) -> list[Any]:
    """One SGLang row per ``ns.batches`` from one server; a failure is every remaining row's one-line error."""
    from relax.backends.sglang.launcher import INSTALL_HINT, _free_port, server_env, sglang_available
    from relax.engine.rollout.engine_client import EngineClient
    from relax.models import load_tokenizer, save_hf
    from relax.utils.http_utils import run_closing

    rows: list[Any] = []

    def fail(message: str) -> list[Any]:
        done = {r.batch for r in rows}
        return rows + [row_class(SGLANG, b, error=message) for b in ns.batches if b not in done]

    if command is server_command and not sglang_available():
        return fail(INSTALL_HINT.split(";")[0])
    try:
        model, _ = workload(ns, ns.batches[0])
        model_dir = Path(ns.sglang_model_dir) / ns.model
        save_hf(model, load_tokenizer(ns.model), model_dir)  # the embedded rows' weights (seed 0, the model dtype)
        port = _free_port()
        server = Server(command(ns, str(model_dir), port, _free_port()), server_env(), Path(ns.sglang_log),
                        f"http://127.0.0.1:{port}")
        client = EngineClient(server.url, timeout=ns.timeout)
        with running(server, ns.sglang_startup_timeout) as startup_s:
            log(f"[bench_engine]   SGLang server up in {startup_s:.0f} s (log: {server.log})")
            for batch in ns.batches:
                rows.append(_measure(ns, row_class, workload, mismatch, model, client, batch, run_closing))
                r = rows[-1]
                log(f"[bench_engine]   sglang at batch {batch}: {r.error or f'{r.tokens_per_s:,.0f} tok/s'}")
    except Exception as exc:  # noqa: BLE001 - the rows not measured say why, in one line; the server is stopped
        return fail(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
    return rows


def _measure(ns: argparse.Namespace, row_class: type, workload: Callable, mismatch: Callable, model: Any,
             client: Any, batch: int, run_closing: Callable) -> Any:
    from ci.bench_engine import engine_requests

    _, prompts = workload(ns, batch, model=model)
    requests = sglang_requests(engine_requests(prompts, ns.new, 0))
    warmup = sglang_requests(engine_requests(prompts[:WARMUP_ROWS], WARMUP_NEW, 10_000))
    try:
        walls, server_s, responses = run_closing(
            timed_batches(client, warmup, requests, ns.new, ns.repeats, ns.sglang_requests))
    except Exception as exc:  # noqa: BLE001 - this batch's row carries the error; the next batch still runs
        return row_class(SGLANG, batch, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}")
    row = row_class(SGLANG, batch, tokens_per_s=batch * ns.new / statistics.median(walls), walls_s=walls,
                    server_s=server_s)
    row.mismatch_mean, row.mismatch_max = mismatch(model, requests, responses, ns.device)
    return row


def describe(ns: argparse.Namespace) -> str:
    return (f"sglang: {ns.sglang_attention_backend} attention, decode CUDA graphs up to batch {max(ns.batches)}, "
            f"{ns.sglang_requests} /generate, server log {ns.sglang_log}")
