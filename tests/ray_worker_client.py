"""The test cluster's "setup worker" command: a Ray worker forked from the warm zygote (tests/ray_worker_zygote.py).

The raylet runs ``python THIS [site flags] default_worker.py ARGS --serialized-runtime-env-context=CTX
--language=PYTHON ...`` where Ray runs its own ``setup_worker.py``. This script imports nothing heavy (it is on every
worker's path to start): it applies the runtime env's variables as Ray's would, asks the zygote to fork the worker
with this process's stdio, forwards SIGTERM / SIGINT to it and exits with its status. Whatever it cannot hand over
as is (a runtime env with a command prefix, another interpreter, a container entrypoint, an environment the zygote
refuses, no zygote) it hands to Ray's own ``setup_worker.py`` unchanged.
"""

from __future__ import annotations

import argparse
import array
import importlib.util
import json
import os
import re
import signal
import socket
import struct
import sys

SOCKET_ENV = "TEST_RAY_WORKER_ZYGOTE"  # tests/ray_worker_zygote.py's: this runs as a plain script, not from tests


def _ray_setup_worker() -> str:
    spec = importlib.util.find_spec("ray")  # finds the package without importing it
    assert spec is not None and spec.submodule_search_locations
    return os.path.join(list(spec.submodule_search_locations)[0], "_private", "workers", "setup_worker.py")


def _fallback() -> None:
    os.execv(sys.executable, [sys.executable, _ray_setup_worker(), *sys.argv[1:]])


def expand(value: str, env: dict[str, str]) -> str:
    """Ray's update_envs: $X and ${X} from the environment so far, unset ${X} as empty."""
    value = re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: env.get(m.group(1) or m.group(2), m.group(0)), value)
    return re.sub(r"\$\{[A-Z0-9_]+\}", "", value)


def main() -> None:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--serialized-runtime-env-context", default=None)
    parser.add_argument("--language", default=None)
    args, rest = parser.parse_known_args()
    context = json.loads(args.serialized_runtime_env_context or "{}")
    path = os.environ.get(SOCKET_ENV)
    plain = (args.language == "PYTHON" and rest and rest[0].endswith("default_worker.py")
             and not context.get("command_prefix") and not context.get("override_worker_entrypoint")
             and context.get("py_executable") in (None, sys.executable))
    if not plain or not path:
        _fallback()
    env = dict(os.environ)
    for key, value in (context.get("env_vars") or {}).items():
        env[key] = expand(value, env)
    payload = json.dumps({"argv": rest, "env": env, "cwd": os.getcwd()}).encode()
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        conn.sendmsg([struct.pack("!I", len(payload)) + payload],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [0, 1, 2]))])
        reader = conn.makefile("r")
        first = reader.readline().split()
    except OSError:  # no zygote (yet, or any more)
        first = []
    if not first or first[0] != "pid":
        conn.close()
        _fallback()
    child = int(first[1])

    def forward(signum: int, _frame: object) -> None:
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    line = reader.readline().split()  # "status N" when the worker has exited; nothing if the zygote died
    if len(line) != 2 or line[0] != "status":
        os._exit(1)
    status = int(line[1])
    if os.WIFSIGNALED(status):
        signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
        os.kill(os.getpid(), os.WTERMSIG(status))
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


if __name__ == "__main__":
    main()
