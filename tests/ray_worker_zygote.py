"""A warm parent for the test cluster's Ray workers (the server half; the client is tests/ray_worker_client.py).

Why: each Ray worker of a ``relax train`` run on the 2-core CI machine spent ~5 of its ~7.5 CPU-s before its actor
ran a line of relax: two Python start-ups (Ray's ``setup_worker.py``, then, through bash, ``default_worker.py``) and
the imports of Ray, torch, transformers and relax's actor modules; the suite starts several hundred workers. This
process imports torch, transformers and relax's trainer and engine modules once (not Ray: see PRELOAD). For each
worker the raylet starts, the client (the raylet's "setup worker" command on the shared test cluster) hands it the
worker's argv, environment, working directory and stdio, and it forks a child that runs Ray's own
``default_worker.py`` from there. The child is the Ray worker: it registers with the raylet under its own pid, which
the raylet then signals and kills; the client waits for it and exits with its status, and a child whose client dies
(the raylet killed a worker before it registered) kills itself. tests/test_ray_worker_zygote.py checks all this.

What a child skips is the imports only, as with the warm driver (tests/driver_forks.py): a request whose environment
differs from this process's in a variable that something may read at import is refused, and the client starts the
worker the ordinary way. Random state a fresh process would draw from the OS is drawn again after the fork.
"""

from __future__ import annotations

import array
import contextlib
import importlib
import json
import os
import select
import signal
import socket
import struct
import sys
import threading

from tests.driver_forks import RUN_TIME_PREFIXES, RUN_TIME_VARIABLES

SOCKET_ENV = "TEST_RAY_WORKER_ZYGOTE"  # the socket's path, in the node's (and so each worker's) environment
# imported once here: what a relax worker imports before its actor runs (heavy third-party first)
# Not Ray: its C++ side reads every RAY_* variable once, into a singleton, and each worker's (RAY_JOB_ID,
# RAY_RAYLET_PID) are its own; nothing here may import it (checked).
PRELOAD = ("torch", "transformers", "transformers.modeling_utils", "transformers.masking_utils",
           "transformers.activations", "numpy", "relax.backends.torch.backend", "relax.backends.embedded.hosting",
           "relax.backends.embedded.server", "relax.backends.embedded.scheduler", "relax.engine.rollout.engine_client")
# variables a worker's environment may set otherwise than this process's: what the warm driver accepts (read when a
# run starts, not at import), Ray's per-worker RAY_* (Ray is not imported here) and the GPUs (read at CUDA's start)
_RUN_TIME_PREFIXES = (*RUN_TIME_PREFIXES, "RAY_")
_RUN_TIME_VARIABLES = (*RUN_TIME_VARIABLES, "CUDA_VISIBLE_DEVICES")
_HEADER = struct.Struct("!I")


def env_differences(env: dict[str, str], own: dict[str, str]) -> list[str]:
    """The variables ``env`` sets otherwise than ``own`` that something may read at import."""
    keys = set(env) | set(own)
    return sorted(k for k in keys if env.get(k) != own.get(k)
                  and not k.startswith(_RUN_TIME_PREFIXES) and k not in _RUN_TIME_VARIABLES)


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    """One request: a length-prefixed JSON payload, the client's stdin/stdout/stderr passed along with it."""
    fds = array.array("i")
    data, ancdata, _, _ = conn.recvmsg(65536, socket.CMSG_SPACE(3 * fds.itemsize))
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(payload[: len(payload) - len(payload) % fds.itemsize])
    while len(data) < _HEADER.size or len(data) < _HEADER.size + _HEADER.unpack_from(data)[0]:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the client closed before its request was complete")
        data += chunk
    (size,) = _HEADER.unpack_from(data)
    return json.loads(data[_HEADER.size: _HEADER.size + size]), list(fds)


def _reap(children: dict[int, socket.socket]) -> None:
    """Tell each finished child's client its wait status (the client exits with it)."""
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = children.pop(pid, None)
        if conn is not None:
            with contextlib.suppress(OSError):
                conn.sendall(f"status {status}\n".encode())
            conn.close()


def serve(path: str, own: dict[str, str]) -> tuple[dict, list[int], socket.socket] | None:
    """Accept requests until the parent (the test process) goes; returns, in a forked child, what it runs. ``own``:
    this process's environment before the imports (some set variables, as they would in the worker)."""
    parent = os.getppid()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    children: dict[int, socket.socket] = {}
    print("ready", flush=True)
    while os.getppid() == parent:
        ready, _, _ = select.select([listener], [], [], 0.2)
        _reap(children)
        if not ready:
            continue
        conn, _ = listener.accept()
        conn.settimeout(10)  # a client sends its request at once: one that does not cannot hold up the others
        try:
            request, fds = _receive(conn)
            conn.settimeout(None)
        except (OSError, ValueError) as exc:
            print(f"bad request: {exc}", file=sys.stderr, flush=True)
            conn.close()
            continue
        differences = env_differences(request["env"], own)
        if differences:
            for fd in fds:
                os.close(fd)
            print("refused:", *(f"{k}={request['env'].get(k)!r}/{own.get(k)!r}" for k in differences), flush=True)
            with contextlib.suppress(OSError):  # a client gone meanwhile: nothing to tell
                conn.sendall(f"refused {' '.join(differences)}\n".encode())
            conn.close()
            continue
        pid = os.fork()
        if pid == 0:
            listener.close()
            for other in children.values():
                other.close()
            return request, fds, conn
        for fd in fds:
            os.close(fd)
        with contextlib.suppress(OSError):  # a client gone meanwhile: its child sees the end of file and dies
            conn.sendall(f"pid {pid}\n".encode())
        children[pid] = conn
    return None


def _die_with_client(conn: socket.socket) -> None:
    """The client sends nothing after its request: end of file means it is gone, and so must this worker be."""
    with contextlib.suppress(OSError):
        while conn.recv(1):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def become_worker(request: dict, fds: list[int], conn: socket.socket, imports_set: dict[str, str]) -> None:
    """Turn this forked child into the process ``python ARGV`` would have been, then run Ray's worker in it: the
    leader of a process group of its own, as the raylet starts its workers (the raylet ends a worker's group).
    ``imports_set``: the variables the preloaded imports set, which they would have set in the worker too."""
    os.setpgid(0, 0)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ.update({k: v for k, v in imports_set.items() if k not in request["env"]})
    os.chdir(request["cwd"])
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    threading.Thread(target=_die_with_client, args=(conn,), daemon=True).start()
    argv = request["argv"]
    sys.argv = list(argv)
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    import runpy

    runpy.run_path(argv[0], run_name="__main__")


def main() -> None:
    path = os.environ[SOCKET_ENV]
    own = dict(os.environ)
    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a module that does not import here is imported by the worker
            print(f"preload {name}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
    if "ray" in sys.modules:
        sys.exit("the zygote imported ray: its workers would share one Ray configuration (see PRELOAD)")
    imports_set = {k: v for k, v in os.environ.items() if k not in own}
    child = serve(path, own)
    if child is not None:
        become_worker(*child, imports_set)


if __name__ == "__main__":
    main()
