"""Real SGLang servers in the loop (``--rollout-backend sglang``): one Ray actor per engine starts
``python -m sglang.launch_server`` as a child process and reports where it serves.

The command (`launch_command`): the model of ``--hf-checkpoint``, ``--rollout-num-gpus-per-engine``
as ``--tp-size``, a per-engine ``--random-seed`` (``--seed`` + the engine index), the GPUs Ray gave
the actor (``CUDA_VISIBLE_DEVICES``, so ``--base-gpu-id 0``), free ports for the server and its NCCL
rendezvous, the trainer's export dtype (so both sides' weights agree), ``--enable-memory-saver``
when the engines release memory between rollouts (``--offload-rollout``), the run's API key when it
serves off loopback, then every ``--sglang-*`` flag spelled SGLang's way (server_args.py). The actor
waits for ``/health_generate``; a server that exits or does not come up in time fails the start
with the tail of its log. Weights then arrive over the engine contract like any engine's (a stock
SGLang server reports no checksums: weights.jsonl says so).
"""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path
from typing import Any

import ray

from relax.engine.launcher import EngineLauncher, EngineRecord
from relax.weights.transports import SyncTarget

INSTALL_HINT = ("--rollout-backend sglang needs SGLang: pip install 'sglang[all]==0.5.10.post1' (it pins torch 2.9.1), "
                "or build containers/Dockerfile.gpu; or use --rollout-backend embedded")
START_TIMEOUT_S = 900.0


def sglang_available() -> bool:
    return importlib.util.find_spec("sglang") is not None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launch_command(args: Namespace, *, engine_index: int, host: str, port: int, nccl_port: int,
                   api_key: str | None, python: str = sys.executable) -> list[str]:
    """The ``sglang.launch_server`` command of engine ``engine_index`` (tested by the command it builds)."""
    from relax.backends.sglang.server_args import server_arg_tokens
    from relax.backends.train_registry import weight_dtype

    dtype = str(weight_dtype(args.train_backend, args.bf16)).removeprefix("torch.")
    cmd = [python, "-m", "sglang.launch_server", "--model-path", str(args.hf_checkpoint), "--host", host,
           "--port", str(port), "--tp-size", str(args.rollout_num_gpus_per_engine),
           "--random-seed", str(args.seed + engine_index), "--base-gpu-id", "0", "--nccl-port", str(nccl_port),
           "--dtype", dtype]
    if args.offload_rollout:
        cmd.append("--enable-memory-saver")
    if api_key:
        cmd += ["--api-key", api_key]
    declared = {"mem_fraction_static": args.sglang_mem_fraction_static}  # seed 000's --sglang-* rows
    passthrough = {**{k: v for k, v in declared.items() if v is not None}, **args.sglang_passthrough}
    return cmd + server_arg_tokens(passthrough)


@ray.remote
class SGLangEngineActor:
    """Owns one SGLang server process (on the GPUs Ray gave this actor)."""

    def __init__(self, args: Namespace, engine_id: int, host: str = "127.0.0.1", api_key: str | None = None,
                 log_dir: str | None = None):
        if host == "node":
            host = ray.util.get_node_ip_address()
        port = _free_port()
        self.url = f"http://{host}:{port}"
        self.command = launch_command(args, engine_index=engine_id, host=host, port=port, nccl_port=_free_port(),
                                      api_key=api_key)
        self.log_path = Path(log_dir or "/tmp") / f"sglang-engine-{engine_id}-{port}.log"
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
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

    def count(self) -> int:
        return len(self.slots)

    def begin(self, indices: list[int]) -> Any:
        """Each engine's actor holds its placement slot's GPUs (``--rollout-num-gpus-per-engine`` of one node)."""
        return indices, [SGLangEngineActor.options(**self.slots[i].options).remote(
            self.args, i, self.host, self.api_key, str(self.args.output_dir)) for i in indices]

    def finish(self, pending: Any) -> list[EngineRecord]:
        indices, actors = pending
        answers = ray.get([a.endpoint.remote() for a in actors])
        pids = ray.get([a.pid.remote() for a in actors])
        return [EngineRecord(i, SyncTarget(f"engine:{i}", url, device, reports_checksums=False,
                                           tp_size=self.args.rollout_num_gpus_per_engine, api_key=self.api_key),
                             actor, pid)
                for i, actor, (url, device), pid in zip(indices, actors, answers, pids, strict=True)]
