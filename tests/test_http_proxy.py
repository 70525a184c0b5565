"""--http-proxy (seed 000): the run's outbound HTTP calls to services (the --rm-url reward service) go through the
proxy. A tiny forwarding proxy counts what passes; the reward service counts what arrives."""

from __future__ import annotations

import asyncio
import json
import threading
import urllib.request
from argparse import Namespace
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from relax.engine.rewards import RewardConfig, compute_rewards
from relax.utils.types import Sample
from tests.e2e_helpers import FAST_FLAGS, read_jsonl, run_relax


def _serve(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


class _Quiet(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as aiohttp's pooled connections expect

    def log_message(self, *a) -> None:
        pass

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def services() -> Iterator[tuple[str, str, list, list]]:
    """(reward URL, proxy URL, what the reward service got, the URLs the proxy forwarded). The service tags each
    request with whether it came from the proxy (its forwarding client's User-Agent)."""
    scored: list = []
    forwarded: list = []

    class Reward(_Quiet):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            scored.append({**body, "via_proxy": self.headers.get("User-Agent", "").startswith("Python-urllib")})
            self._answer(200, json.dumps(0.25 + 0.5 * (body["response"] == body["label"])).encode())

        def do_GET(self) -> None:  # noqa: N802 - /health, as an SGLang server
            scored.append(self.path)
            self._answer(200, b"")

    class Proxy(_Quiet):
        def do_POST(self) -> None:  # noqa: N802 - a proxy gets the absolute URL as the path
            forwarded.append(self.path)
            data = self.rfile.read(int(self.headers["Content-Length"]))
            req = urllib.request.Request(self.path, data=data, headers={"Content-Type": self.headers["Content-Type"]})
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(req, timeout=30) as resp:
                self._answer(resp.status, resp.read())

        def do_GET(self) -> None:  # noqa: N802
            forwarded.append(self.path)
            opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
            with opener.open(self.path, timeout=30) as resp:
                self._answer(resp.status, resp.read())

    reward, proxy = _serve(Reward), _serve(Proxy)
    try:
        yield (f"http://127.0.0.1:{reward.server_port}/reward", f"http://127.0.0.1:{proxy.server_port}",
               scored, forwarded)
    finally:
        reward.shutdown()
        proxy.shutdown()


def _args(rm_url: str, http_proxy: str | None) -> Namespace:
    return Namespace(custom_rm_path=None, rm_type="remote_rm", group_rm=False, reward_key=None, rm_url=rm_url,
                     hook_timeout=60.0, http_proxy=http_proxy, genrm_model_path=None, genrm_num_gpus=1,
                     genrm_num_gpus_per_engine=1, genrm_engine_config=None, genrm_sampling_config=None)


def test_remote_reward_calls_go_through_the_proxy(services) -> None:
    rm_url, proxy, scored, forwarded = services
    samples = [Sample(index=i, prompt="p", response=r, label="7") for i, r in enumerate(["7", "3"])]
    rewards = asyncio.run(compute_rewards(RewardConfig.from_args(_args(rm_url, proxy)), samples))
    assert rewards == [0.75, 0.25] and len(scored) == 2 and forwarded == [rm_url, rm_url]
    assert all(s["via_proxy"] for s in scored)
    asyncio.run(compute_rewards(RewardConfig.from_args(_args(rm_url, None)), samples))
    assert len(scored) == 4 and len(forwarded) == 2 and not any(s["via_proxy"] for s in scored[2:])  # direct


def test_the_opd_teacher_server_is_reached_through_the_proxy(services) -> None:
    """--opd-type sglang with --rm-url: the teacher's calls go through the proxy (here its /health check)."""
    from relax.engine.rollout.opd_teacher import start_teacher, stop_teacher
    from relax.engine.rollout.teacher_config import TeacherConfig

    rm_url, proxy, scored, forwarded = services
    base = rm_url.removesuffix("/reward")
    cfg = TeacherConfig(rm_url=base, http_proxy=proxy, opd_teacher_load=None, seed=0, rollout_temperature=1.0)
    try:
        assert start_teacher(cfg, "cpu").proxy == proxy
    finally:
        stop_teacher()
    assert scored == ["/health"] and forwarded == [f"{base}/health"]


@pytest.mark.ray
def test_a_run_scores_through_the_proxy(services, tmp_path: Path) -> None:
    rm_url, proxy, scored, forwarded = services
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "1", "--rm-type", "remote_rm", "--rm-url", rm_url,
                      "--http-proxy", proxy, "--output-dir", str(run)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(scored) >= 8 * 4 and all(s["via_proxy"] for s in scored)
    assert set(forwarded) == {rm_url} and len(forwarded) >= len(scored)
    assert read_jsonl(run / "metrics.jsonl")
