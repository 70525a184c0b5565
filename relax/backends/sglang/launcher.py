"""Real SGLang servers in the loop (``--rollout-backend sglang``): one Ray actor per engine starts
``python -m sglang.launch_server`` as a child process and reports where it serves.

The command (`launch_command`): the model of ``--hf-checkpoint``, ``--rollout-num-gpus-per-engine``
as ``--tp-size``, a per-engine ``--random-seed`` (``--seed`` + the engine index), the GPUs Ray gave
the actor (``CUDA_VISIBLE_DEVICES``, so ``--base-gpu-id 0``; a colocated engine of several GPUs is given the
GPUs of its bundles, `relax.distributed.placement.gpu_ids`), free ports for the server and its NCCL
rendezvous, the trainer's export dtype (so both sides' weights agree), ``--enable-memory-saver``
when the engines release memory between rollouts (``--offload-rollout``), the run's API key when it
serves off loopback, then every ``--sglang-*`` flag spelled SGLang's way (server_args.py). The actor
waits for ``/health_generate``; a server that exits or does not come up in time fails the start
with the tail of its log. Weights then arrive over the engine contract like any engine's; equality is read
back through SGLang's own ``/weights_checker`` hashes (`relax.weights.sglang_checksums`).

SGLang 0.5.14 pins its own transformers (5.8.1) and tokenizers, so it may live in an environment of its own:
``RELAX_SGLANG_PYTHONPATH`` (a ``pip install --target`` directory, e.g. ci/wheelhouse/install_sglang.sh's
/tmp/sglsite) goes first on the server's PYTHONPATH only; relax's own processes keep theirs. A model preset
(``--hf-checkpoint small-qwen3``) has no directory for the server to load: the launcher writes the preset's
seeded initial weights, config and tokenizer once under the run's output dir (the first weight sync
overwrites the weights anyway).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import ray

from relax.backends.sglang.config import SGLangLaunchConfig
from relax.engine.launcher import EngineLauncher, EngineRecord
from relax.weights.transports import SyncTarget

SGLANG_PYTHONPATH = "RELAX_SGLANG_PYTHONPATH"
INSTALL_HINT = ("--rollout-backend sglang needs SGLang: pip install 'sglang==0.5.14' (it pins torch 2.11.0), or set "
                f"{SGLANG_PYTHONPATH} to a directory it is installed in (ci/wheelhouse/install_sglang.sh); or use "
                "--rollout-backend embedded")
START_TIMEOUT_S = 900.0
HEALTH_GENERATION_ENV = "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION"


def sglang_site() -> str | None:
    """The directory ``RELAX_SGLANG_PYTHONPATH`` names, when set."""
    return os.environ.get(SGLANG_PYTHONPATH) or None


def sglang_available() -> bool:
    site = sglang_site()
    if site is not None:
        return (Path(site) / "sglang" / "__init__.py").is_file()
    return importlib.util.find_spec("sglang") is not None


def server_env(gpu_ids: list[str] | None = None) -> dict[str, str]:
    """The server process's environment: this one, with ``RELAX_SGLANG_PYTHONPATH`` first on its path.

    Two settings are relax's: NCCL's cuMem switch equal to the trainer's (relax/distributed/cluster.py says why),
    and ``/health`` answering without generating. SGLang 0.5.14 serves ``/health`` like ``/health_generate`` (a
    one-token prefill) unless ``SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION`` is off, and relax's liveness probes hit
    ``/health`` while a colocated engine's memory is released: that prefill then reads unmapped memory and kills
    the server (seen on an H200: "Pointer argument (at 0) cannot be accessed from Triton"). The launcher's own
    readiness wait asks ``/health_generate``, which still generates. ``gpu_ids``: the GPUs of a colocated engine of
    several GPUs (its actor was given the first only), as ``CUDA_VISIBLE_DEVICES``."""
    from relax.distributed.cluster import nccl_cumem_env

    env = {**os.environ, "PYTHONUNBUFFERED": "1", **nccl_cumem_env()}
    env.setdefault(HEALTH_GENERATION_ENV, "false")
    if gpu_ids:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(gpu_ids)
    site = sglang_site()
    if site is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
    return env


def server_model_path(cfg: SGLangLaunchConfig) -> str:
    """What the server loads: ``--hf-checkpoint`` itself, or a preset written under the output dir (once)."""
    from relax.backends.train_registry import weight_dtype
    from relax.models.registry import PRESETS, build_model, load_tokenizer, save_hf

    name = str(cfg.hf_checkpoint)
    if name not in PRESETS:
        return name
    out = Path(cfg.output_dir) / "sglang_model" / name
    if not (out / "config.json").is_file():
        dtype = weight_dtype(cfg.train_backend, cfg.bf16)
        save_hf(build_model(name, dtype=dtype, seed=cfg.seed), load_tokenizer(name), out)
    return str(out)


# SGLang 0.5.14 derives more ports from --port (its gRPC port is --port + 10000, refused above 65535)
MAX_SERVER_PORT = 65535 - 10000


def _free_port(below: int = MAX_SERVER_PORT) -> int:
    """A port the OS calls free, under ``below`` (ephemeral ports reach 60999: redraw those above)."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        if port <= below:
            return port
    raise RuntimeError(f"no free port at or below {below} in 100 draws")


def launch_command(cfg: SGLangLaunchConfig, *, engine_index: int, host: str, port: int, nccl_port: int,
                   api_key: str | None, python: str = sys.executable, model_path: str | None = None) -> list[str]:
    """The ``sglang.launch_server`` command of engine ``engine_index`` (tested by the command it builds)."""
    from relax.backends.sglang.server_args import server_arg_tokens
    from relax.backends.train_registry import weight_dtype

    dtype = str(weight_dtype(cfg.train_backend, cfg.bf16)).removeprefix("torch.")
    model = model_path or str(cfg.hf_checkpoint)
    cmd = [python, "-m", "sglang.launch_server", "--model-path", model, "--host", host,
           "--port", str(port), "--tp-size", str(cfg.rollout_num_gpus_per_engine),
           "--random-seed", str(cfg.seed + engine_index), "--base-gpu-id", "0", "--nccl-port", str(nccl_port),
           "--dtype", dtype]
    if cfg.offload_rollout:
        cmd.append("--enable-memory-saver")
    if api_key:
        cmd += ["--api-key", api_key]
    declared = {"mem_fraction_static": cfg.sglang_mem_fraction_static}  # seed 000's --sglang-* rows
    passthrough = {**{k: v for k, v in declared.items() if v is not None}, **cfg.sglang_passthrough}
    return cmd + server_arg_tokens(passthrough)


@ray.remote
class SGLangEngineActor:
    """Owns one SGLang server process (on the GPUs Ray gave this actor)."""

    def __init__(self, cfg: SGLangLaunchConfig, engine_id: int, host: str = "127.0.0.1", api_key: str | None = None,
                 log_dir: str | None = None, model_path: str | None = None, gpu_ids: list[str] | None = None):
        if gpu_ids:
            own = [str(i) for i in ray.get_runtime_context().get_accelerator_ids().get("GPU", [])]
            if own[:1] != gpu_ids[:1]:
                raise RuntimeError(f"engine {engine_id}: its actor holds GPU {own} but its bundles start at GPU "
                                   f"{gpu_ids[0]}")
        self.compute_gpus = gpu_ids  # what events.jsonl reports for it (relax.distributed.placement.where)
        if host == "node":
            host = ray.util.get_node_ip_address()
        port = _free_port()
        self.url = f"http://{host}:{port}"
        self.command = launch_command(cfg, engine_index=engine_id, host=host, port=port, nccl_port=_free_port(),
                                      api_key=api_key, model_path=model_path)
        self.log_path = Path(log_dir or "/tmp") / f"sglang-engine-{engine_id}-{port}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=server_env(gpu_ids))
        self._wait_ready(api_key)

    def _wait_ready(self, api_key: str | None) -> None:
        import urllib.error
        import urllib.request

        deadline = time.monotonic() + START_TIMEOUT_S
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"SGLang server exited with {self.proc.returncode} before serving: "
                                   f"{self._log_tail()}")
            try:
                req = urllib.request.Request(f"{self.url}/health_generate", headers=headers)
                with urllib.request.urlopen(req, timeout=30) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(1.0)
        self.proc.kill()
        raise RuntimeError(f"SGLang server at {self.url} not healthy within {START_TIMEOUT_S} s: {self._log_tail()}")

    def _log_tail(self, lines: int = 20) -> str:
        try:
            return " | ".join(self.log_path.read_text().splitlines()[-lines:])
        except OSError:
            return f"(no log at {self.log_path})"

    def pid(self) -> int:
        return self.proc.pid

    def device_bytes(self) -> int:
        """0: the server's GPU memory is held by its own processes, not this actor's (the offload metrics count
        the embedded engines' bytes; an SGLang engine's release and resume are timed, not sized)."""
        return 0

    def freeze_gc(self) -> int:
        """The runtime freezes every engine actor's startup objects; this actor holds none worth freezing."""
        return 0

    def endpoint(self) -> tuple[str, str]:
        import torch

        from relax.weights.devices import device_identity

        device = device_identity(torch.device("cuda", 0)) if torch.cuda.is_available() else "unknown"
        return self.url, device

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)


class SGLangLauncher(EngineLauncher):
    name = "sglang"
    config_class = SGLangLaunchConfig
    graceful_stop = "stop"  # SIGTERM to the server's process group, SIGKILL after 30 s
    cfg: SGLangLaunchConfig

    def count(self) -> int:
        return len(self.slots)

    def begin(self, indices: list[int]) -> Any:
        """Each engine's actor holds its placement slot's GPUs (``--rollout-num-gpus-per-engine`` of one node); a
        colocated engine of several GPUs holds a share of the first, and its server is given all of them."""
        from relax.distributed.placement import gpu_ids

        model_path = server_model_path(self.cfg)
        spans = {i: gpu_ids(self.slots[i]) for i in indices if self.slots[i].span}
        return indices, [SGLangEngineActor.options(**self.slots[i].options).remote(
            self.cfg, i, self.host, self.api_key, str(self.cfg.output_dir), model_path, spans.get(i)) for i in indices]

    def finish(self, pending: Any) -> list[EngineRecord]:
        from relax.models.registry import key_value_heads

        indices, actors = pending
        answers = ray.get([a.endpoint.remote() for a in actors])
        pids = ray.get([a.pid.remote() for a in actors])
        kv_heads = key_value_heads(str(self.cfg.hf_checkpoint))
        return [EngineRecord(i, SyncTarget(f"engine:{i}", url, device, checksums="sglang",
                                           tp_size=self.cfg.rollout_num_gpus_per_engine, api_key=self.api_key,
                                           kv_heads=kv_heads), actor, pid)
                for i, actor, (url, device), pid in zip(indices, actors, answers, pids, strict=True)]
