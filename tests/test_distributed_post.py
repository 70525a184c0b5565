"""--use-distributed-post (relax/engine/rollout/distributed_post.py): with poster actors installed, the rollout's
/generate shares and a recipe's ``http_utils.post`` reach the engine from the posters' processes (the engine's
peer sockets belong to them, not to the driver), and the answers, their order and the errors are the default
path's. Plus one short ``relax train`` run with the flag."""

from __future__ import annotations

import json
import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from relax.engine.rollout.engine_client import EngineClient, EngineHTTPError
from relax.engine.rollout.engine_pool import HttpEnginePool
from relax.utils import http_utils
from tests.e2e_helpers import FAST_FLAGS, assert_ok, in_process_ray, read_jsonl, run_relax
from tests.fake_sglang_server import answer, send_json


class _Engine:
    """An SGLang-shaped /generate in a thread of this process that records each request's peer port."""

    def __init__(self) -> None:
        self.peers: list[int] = []
        engine = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # keep-alive: a client's connection stays open (and findable) after

            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                engine.peers.append(self.client_address[1])
                if req.get("rid") == "bad":
                    status, body = 400, {"error": {"message": "bad request"}}
                elif req["input_ids"] and isinstance(req["input_ids"][0], list):
                    status, body = 200, [answer(i, p, False) for i, p in zip(req["input_ids"],
                                                                              req["sampling_params"], strict=True)]
                else:
                    status, body = 200, answer(req["input_ids"], req["sampling_params"], False)
                send_json(self, status, body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


def _pid_of_client_port(port: int) -> int | None:
    """The process holding the TCP socket bound to local port ``port`` (Linux /proc)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as fh:
            for line in fh.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port:
                    inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes} for fd in fds):
                return int(pid)
        except OSError:
            continue
    return None


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    yield from in_process_ray(tmp_path_factory.mktemp("ray"))


def _requests() -> list[dict]:
    return [{"input_ids": [i + 1, i + 2, 7], "sampling_params": {"max_new_tokens": 3 + i % 2, "sampling_seed": i},
             "return_logprob": True} for i in range(8)]


@pytest.mark.ray
def test_the_posters_send_the_rollouts_posts_and_the_answers_are_the_default_paths(ray_cluster) -> None:
    from relax.engine.rollout.distributed_post import DistributedPoster

    engine = _Engine()
    pool = HttpEnginePool(EngineClient(engine.url, timeout=30), engines=lambda: 2)  # two shares per batch
    default = http_utils.run_closing(pool.generate_batch(_requests(), 2))
    driver_peers = set(engine.peers)
    posters = DistributedPoster.start(2)
    http_utils.install_poster(posters)
    try:
        engine.peers.clear()
        answers = [http_utils.run_closing(pool.generate_batch(_requests(), 2)) for _ in range(2)]
        recipe = http_utils.run_closing(http_utils.post(f"{engine.url}/generate", _requests()[0]))  # a recipe's own POST
        with pytest.raises(EngineHTTPError) as bad:
            http_utils.run_closing(http_utils.post(f"{engine.url}/generate", {**_requests()[0], "rid": "bad"}))
        senders = {_pid_of_client_port(port) for port in engine.peers}
    finally:
        http_utils.install_poster(None)
    try:
        assert answers == [default, default]  # same answers, same order
        assert recipe == default[0]
        assert bad.value.status == 400 and "bad request" in str(bad.value)  # the engine's error, as without posters
        assert senders == set(posters.pids) and os.getpid() not in senders and len(senders) == 2
        assert not driver_peers & set(engine.peers)
    finally:
        posters.stop()
        engine.server.shutdown()


def test_relax_train_with_distributed_post(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "1", "--use-distributed-post", "--output-dir", str(run)],
                        tmp_path))
    started = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "process_started"]
    posters = [e for e in started if e["role"] == "posters"]
    assert len(posters) == 1 and len(posters[0]["pids"]) == 1  # one per engine
    assert [m["step"] for m in read_jsonl(run / "metrics.jsonl")] == [0]
