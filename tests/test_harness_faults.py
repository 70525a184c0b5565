"""Fault machinery without an engine: triggers, event tailing, and the HTTP fault proxy."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import httpx
import pytest

from harness.faults import EventTail, FaultWatcher, Trigger, parse_fault
from harness.faults.proxy import FaultProxy


def test_trigger_semantics() -> None:
    assert Trigger(step=2).matches({"event": "step_start", "step": 3})  # first step at or after
    assert not Trigger(step=2).matches({"event": "phase", "step": 2, "phase": "train"})
    t = Trigger(step=2, phase="train")
    assert t.matches({"event": "phase", "step": 2, "phase": "train"})
    assert not t.matches({"event": "phase", "step": 2, "phase": "rollout"})
    assert Trigger(event="weights_synced").matches({"event": "weights_synced", "version": 1})
    assert Trigger().matches({"event": "process_started", "role": "engine:0", "pid": 1})


def test_event_tail_reads_only_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    tail = EventTail(path)
    assert tail.read_new() == []
    with open(path, "w") as fh:
        fh.write(json.dumps({"event": "a"}) + "\n" + '{"event": "b"')
    assert [e["event"] for e in tail.read_new()] == ["a"]
    with open(path, "a") as fh:
        fh.write("}\n")
    assert [e["event"] for e in tail.read_new()] == ["b"]


def test_watcher_ignores_services_without_a_local_pid(tmp_path: Path) -> None:
    """An OPD teacher given by --rm-url is logged with pid null; the watcher must not crash on it."""
    path = tmp_path / "events.jsonl"
    path.write_text(json.dumps({"event": "process_started", "role": "opd_teacher", "url": "http://x", "pid": None})
                    + "\n" + json.dumps({"event": "process_started", "role": "engine:0", "pid": 4242}) + "\n")
    watcher = FaultWatcher(path, [], target=None, recorder=None)
    watcher.poll()
    assert watcher.pids == {"engine:0": 4242}
    assert watcher.resolve("opd_teacher") is None


def test_fault_specs_validate() -> None:
    assert parse_fault({"kind": "engine_hook", "hook": "nan_loss", "at_step": 3}).env() == {
        "RELAX_FAULT_NAN_LOSS_AT_STEP": "3"}
    with pytest.raises(ValueError):
        parse_fault({"kind": "http_proxy", "target": "x:1", "error_rate": 2})
    with pytest.raises(ValueError, match="unknown fault"):
        parse_fault({"kind": "meteor"})


class Upstream:
    """A tiny aiohttp server standing in for an engine."""

    def __init__(self) -> None:
        self.port = 0
        self._ready = threading.Event()
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._main, daemon=True).start()
        self._ready.wait(5)

    def _main(self) -> None:
        from aiohttp import web

        async def handle(request):
            body = await request.json() if request.can_read_body else {}
            return web.json_response({"path": request.path, "echo": body})

        async def serve():
            app = web.Application()
            app.router.add_route("*", "/{tail:.*}", handle)
            runner = web.AppRunner(app, access_log=None)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.port = runner.addresses[0][1]
            self._ready.set()
            await asyncio.Event().wait()

        self._loop.run_until_complete(serve())


@pytest.fixture(scope="module")
def upstream() -> Upstream:
    return Upstream()


def test_proxy_forwards(upstream: Upstream) -> None:
    with FaultProxy(f"127.0.0.1:{upstream.port}") as proxy:
        r = httpx.post(f"http://{proxy.address}/generate", json={"input_ids": [1, 2]}, timeout=5)
    assert r.status_code == 200 and r.json() == {"path": "/generate", "echo": {"input_ids": [1, 2]}}
    assert proxy.stats["forwarded"] == 1


def test_proxy_errors_at_rate_with_seed(upstream: Upstream) -> None:
    def codes(seed: int) -> list[int]:
        with FaultProxy(f"127.0.0.1:{upstream.port}", error_rate=0.5, error_status=503, seed=seed) as proxy:
            return [httpx.get(f"http://{proxy.address}/health", timeout=5).status_code for _ in range(40)]

    first = codes(7)
    assert first == codes(7)  # reproducible
    assert 8 <= first.count(503) <= 32 and set(first) == {200, 503}


def test_proxy_latency_and_drop(upstream: Upstream) -> None:
    with FaultProxy(f"127.0.0.1:{upstream.port}", latency_s=0.3) as proxy:
        r = httpx.get(f"http://{proxy.address}/health", timeout=5)
    assert r.elapsed.total_seconds() >= 0.3 and proxy.stats["delayed"] == 1
    with FaultProxy(f"127.0.0.1:{upstream.port}", drop_rate=1.0) as proxy:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://{proxy.address}/health", timeout=5)
    assert proxy.stats["dropped"] == 1


def test_proxy_fault_gives_placeholder_and_stats(tmp_path: Path, upstream: Upstream) -> None:
    from harness.faults import FaultRecorder
    from harness.placeholders import substitute

    fault = parse_fault({"kind": "http_proxy", "name": "engine", "target": f"127.0.0.1:{upstream.port}"})
    values = fault.start(FaultRecorder(tmp_path / "events.jsonl"))
    try:
        url = substitute(["http://{proxy:engine}/health"], values)[0]
        assert httpx.get(url, timeout=5).status_code == 200
    finally:
        stats = fault.stop()
    assert stats == {"proxy_stats": {"requests": 1, "forwarded": 1}}
    started, finished = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert started["kind"] == "http_proxy" and started["event"] == "fault_injected"
    assert finished["event"] == "proxy_stats" and finished["stats"] == {"requests": 1, "forwarded": 1}


def test_a_proxy_in_front_of_an_engine_server_the_scenario_started(tmp_path: Path) -> None:
    """engine_server gives {server:NAME}; an http_proxy after it resolves its target from that."""
    from harness.faults import FaultRecorder

    recorder = FaultRecorder(tmp_path / "events.jsonl")
    server = parse_fault({"kind": "engine_server", "name": "b"})
    proxy = parse_fault({"kind": "http_proxy", "name": "b", "target": "{server:b}", "paths": ["/generate"],
                         "error_rate": 1.0})
    values = server.start(recorder)
    try:
        proxy = proxy.resolve(values)
        assert proxy.target == values["server:b"] and values["server:b"].startswith("http://127.0.0.1:")
        values |= proxy.start(recorder)
        base = f"http://{values['proxy:b']}"
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200  # not a /generate: forwarded
        assert httpx.post(f"{base}/generate", json={"input_ids": [1, 2]}, timeout=10).status_code == 503
        assert httpx.post(f"{values['server:b']}/generate", json={"input_ids": [1, 2], "sampling_params": {
            "max_new_tokens": 2}}, timeout=30).status_code == 200
    finally:
        proxy.stop()
        server.stop()
    assert not server._proc.alive()
    assert [e["event"] for e in recorder.records] == ["server_started", "fault_injected", "proxy_stats"]
