"""A real multi-node Ray cluster on this machine, for tests: ``ray start --head`` plus ``ray start --address``.

Each node is its own ``ray start --block`` process (own temp dir, own ports, ``--num-gpus`` logical GPUs
so that GPU placement is observable on a CPU machine) in a session of its own; stopping sends SIGTERM
to that process, which takes its daemons down, and SIGKILLs the session after a grace period. Nothing
else is touched: never ``ray stop``, which would stop every Ray cluster on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

from tests.ray_worker_zygote import SOCKET_ENV

_CLI = Path(sys.executable).with_name("ray")
# the `ray` script beside this interpreter, else its module (the GPU machine installs ray with --target: no script)
RAY = [str(_CLI)] if _CLI.exists() else [sys.executable, "-m", "ray.scripts.scripts"]
# the cluster's processes: no token auth (a test must not depend on ~/.ray/auth_token), no drain wait on SIGTERM
ENV = {"RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "OMP_NUM_THREADS": "1"}
_ZYGOTE_CLIENT = Path(__file__).with_name("ray_worker_client.py")
# `ray start` with the raylet's "setup worker" command replaced by the zygote's client (an absolute file name joins
# to itself in Ray's os.path.join of its workers dir and this constant)
_RAY_WITH_WARM_WORKERS = ("import ray._private.ray_constants as c; c.SETUP_WORKER_FILENAME = %r; "
                          "from ray.scripts.scripts import main; main()")


def _free_port() -> int:
    return _free_ports(1)[0]


def _free_ports(count: int, avoid: Collection[int] = ()) -> list[int]:
    """``count`` distinct ports free now, none of them in ``avoid``. The sockets stay bound until all are drawn, so
    the OS cannot hand one port out twice (drawn one at a time, two components of a node once got the same port,
    and `ray start` refused it: "metrics_export is trying to use a port number ... used by other components")."""
    sockets: list[socket.socket] = []
    ports: list[int] = []
    try:
        while len(ports) < count:
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
            if (port := s.getsockname()[1]) not in avoid:
                ports.append(port)
        return ports
    finally:
        for s in sockets:
            s.close()


class LocalCluster:
    """``nodes`` nodes with ``gpus`` logical GPUs each; ``address`` is the head's GCS address.

    ``token_home``: the nodes run with token authentication, their token in ``token_home/.ray/auth_token``.

    ``visible``: each node's ``CUDA_VISIBLE_DEVICES`` (one entry per node), so that on a machine with real GPUs
    each node owns its own (``gpus`` of them): two nodes of one host then behave as two GPU machines.

    ``dashboard``: the head runs Ray's dashboard, which serves ``ray job submit`` at ``dashboard_url`` (needs
    ``ray[default]``'s packages).

    ``warm_workers``: each node's Ray workers are forked from a process that has imported torch, transformers and
    relax's trainer and engine modules once (tests/ray_worker_zygote.py), not started from scratch."""

    def __init__(self, nodes: int = 2, gpus: int = 2, cpus: int = 2, visible: list[str] | None = None,
                 token_home: Path | None = None, dashboard: bool = False, warm_workers: bool = False):
        if visible is not None and len(visible) != nodes:
            raise ValueError(f"visible names {len(visible)} nodes' GPUs, the cluster has {nodes} nodes")
        self.nodes, self.gpus, self.cpus, self.visible = nodes, gpus, cpus, visible
        # token authentication on, with the token in token_home/.ray/auth_token (Ray's default place under HOME)
        self.auth = {"RAY_AUTH_MODE": "token", "HOME": str(token_home)} if token_home is not None else {}
        self.dashboard = dashboard
        self.warm_workers = warm_workers
        self._draw_ports()
        self.procs: list[subprocess.Popen] = []
        self.zygotes: list[subprocess.Popen] = []  # warm_workers: each node's worker zygote
        self.node_ids: list[str] = []

    def _draw_ports(self) -> None:
        """Fresh ports and a fresh root: a port found free can be taken by another process before Ray binds it."""
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.dashboard_port = _free_ports(1, avoid={self.port})[0]
        self.dashboard_url = f"http://127.0.0.1:{self.dashboard_port}"
        self.root = Path(tempfile.mkdtemp(prefix="rc", dir="/tmp"))  # short: Ray's socket paths are limited

    def _start_node(self, index: int) -> None:
        agent_http, agent_grpc, runtime_env, metrics, client = map(str, _free_ports(5, avoid={self.port,
                                                                                             self.dashboard_port}))
        flags = ["--num-cpus", str(self.cpus), "--num-gpus", str(self.gpus), "--block", "--disable-usage-stats",
                 "--temp-dir", str(self.root / f"n{index}"), "--dashboard-agent-listen-port", agent_http,
                 "--dashboard-agent-grpc-port", agent_grpc, "--runtime-env-agent-port", runtime_env,
                 "--metrics-export-port", metrics]
        if index == 0:
            flags = ["--head", "--port", str(self.port), "--include-dashboard", str(self.dashboard).lower(),
                     "--dashboard-port", str(self.dashboard_port), "--ray-client-server-port", client, *flags]
        else:
            flags = ["--address", self.address, *flags]
        log = open(self.root / f"n{index}.log", "w")  # noqa: SIM115 - closed with the process
        gpus = {"CUDA_VISIBLE_DEVICES": self.visible[index]} if self.visible is not None else {}
        env = {**os.environ, **ENV, **gpus, **self.auth}
        ray = RAY
        if self.warm_workers:  # every worker in relax's worker environment, so that the zygote can fork it
            from relax.distributed.cluster import worker_env

            env.update(worker_env())
            env[SOCKET_ENV] = str(self.root / f"z{index}.sock")
            ray = [sys.executable, "-c", _RAY_WITH_WARM_WORKERS % str(_ZYGOTE_CLIENT)]
            self._start_zygote(index, env)
        self.procs.append(subprocess.Popen([*ray, "start", *flags], stdout=log, stderr=subprocess.STDOUT,
                                           start_new_session=True, env=env))

    def _start_zygote(self, index: int, env: dict[str, str]) -> None:
        """The node's warm worker parent, in the environment its workers get: the node's and the raylet's
        SPT_NOENV. Until it is ready, workers start the ordinary way."""
        log = open(self.root / f"z{index}.log", "w")  # noqa: SIM115 - closed with the process
        self.zygotes.append(subprocess.Popen([sys.executable, "-m", "tests.ray_worker_zygote"], stdout=log,
                                             stderr=subprocess.STDOUT, start_new_session=True,
                                             cwd=str(Path(__file__).resolve().parents[1]),
                                             env={**env, "SPT_NOENV": "1"}))

    def start(self, timeout: float = 90, attempts: int = 3) -> LocalCluster:
        """Start every node; a start that lost one of its drawn ports to another process (Ray's "Failed to start
        the grpc server" / "address already in use") is retried with new ports, up to ``attempts`` times."""
        for attempt in range(attempts):
            try:
                return self._start_once(timeout)
            except RuntimeError as exc:
                lost_port = "Failed to start the grpc server" in str(exc) or "already in use" in str(exc)
                if not lost_port or attempt == attempts - 1:
                    raise
                self.node_ids = []
                self._draw_ports()
        raise AssertionError("unreachable")

    def _start_once(self, timeout: float) -> LocalCluster:
        self._start_node(0)
        deadline = time.monotonic() + timeout
        while not self._gcs_open():
            self._check(deadline)
            time.sleep(0.2)
        for index in range(1, self.nodes):
            self._start_node(index)
        while len(self.node_ids) < self.nodes:
            self._check(deadline)
            self.node_ids = self._alive_nodes()
            time.sleep(0.5)
        while self.dashboard and not self._open(self.dashboard_port):  # ray job submit fails at once without it
            self._check(deadline)
            time.sleep(0.5)
        return self

    def _gcs_open(self) -> bool:
        return self._open(self.port)

    @staticmethod
    def _open(port: int) -> bool:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return True
        except OSError:
            return False

    def _alive_nodes(self) -> list[str]:
        """Node ids of the alive nodes, asked from a separate driver (this process keeps no Ray connection)."""
        code = "import ray; ray.init(address=%r); print(*[n['NodeID'] for n in ray.nodes() if n['Alive']])"
        try:
            out = subprocess.run([sys.executable, "-c", code % self.address], capture_output=True, text=True,
                                 timeout=30, env={**os.environ, **ENV, **self.auth})
        except subprocess.TimeoutExpired:  # the GCS answers but no raylet registers: start()'s deadline says so
            return []
        return out.stdout.split() if out.returncode == 0 else []

    def _gcs_lost_its_port(self) -> bool:
        """The head's GCS could not bind its port (the `ray start` process itself only exits ~40 s later)."""
        return any("Failed to start the grpc server" in path.read_text(errors="replace")
                   for path in self.root.glob("n0/session_latest/logs/gcs_server.*") if path.is_file())

    def _check(self, deadline: float) -> None:
        dead = [i for i, p in enumerate(self.procs) if p.poll() is not None]
        dead += [f"zygote {i}" for i, p in enumerate(self.zygotes) if p.poll() is not None]  # see z<i>.log
        if dead or time.monotonic() > deadline or self._gcs_lost_its_port():
            logs = "\n".join((self.root / f"n{i}.log").read_text()[-2000:] for i in range(len(self.procs)))
            logs += "\n" + self.diagnostics() + "\n" + self._log_tails("*agent*", "raylet.err", "dashboard.*")
            logs += "".join(f"\n== z{i}.log\n" + (self.root / f"z{i}.log").read_text()[-2000:]
                              for i in range(len(self.zygotes)))
            lost = self._gcs_lost_its_port()
            self.stop()
            why = " (the head's GCS: Failed to start the grpc server, its port was taken)" if lost else ""
            raise RuntimeError(f"test Ray cluster did not start (nodes {dead} exited){why}\n{logs}")

    def diagnostics(self, lines: int = 15) -> str:
        """What the nodes' logs say about dead workers (raylet lines naming an exit or kill, the tails of the
        workers' stderr files that are not empty): for a test's failure message, since stop() deletes them."""
        out = []
        for raylet in sorted(self.root.glob("n*/session_latest/logs/raylet.out")):
            hits = [line for line in raylet.read_text(errors="replace").splitlines() if not line.startswith("[state")
                    and any(w in line for w in ("exit", "Kill", "kill", "died", "OOM", "low on memory", "SIG"))]
            out += [f"== {raylet.relative_to(self.root)}", *hits[-lines:]]
        for gcs in sorted(self.root.glob("n*/session_latest/logs/gcs_server.out")):
            hits = [line for line in gcs.read_text(errors="replace").splitlines()
                    if any(w in line for w in ("DEAD", "dead", "out of scope", "references", "owner", "Job ", "job "))]
            out += [f"== {gcs.relative_to(self.root)}", *hits[-lines:]]
        errs = [p for p in self.root.glob("n*/session_latest/logs/worker-*.err") if p.stat().st_size]
        for err in sorted(errs, key=lambda p: p.stat().st_mtime)[-3:]:
            out += [f"== {err.relative_to(self.root)}", *err.read_text(errors="replace").splitlines()[-lines:]]
        return "\n".join(out)

    def _log_tails(self, *patterns: str, lines: int = 10) -> str:
        """The last lines of the nodes' log files named by ``patterns`` (a node that does not come up says why there)."""
        out = []
        for pattern in patterns:
            for path in sorted(self.root.glob(f"n*/session_latest/logs/{pattern}")):
                if path.is_file() and path.stat().st_size:
                    tail = path.read_text(errors="replace").splitlines()[-lines:]
                    out += [f"== {path.relative_to(self.root)}", *tail]
        return "\n".join(out)

    def stop(self) -> None:
        for proc in [*reversed(self.procs), *self.zygotes]:  # workers first, then the head, then the zygotes
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.procs, *self.zygotes]:
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                pass
            try:  # daemons the node left behind: they share its session (process group)
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        self.procs, self.zygotes = [], []
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
