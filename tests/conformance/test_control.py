"""Health, info, cache, abort, pause / continue and memory endpoints, as relax calls them (`EngineClient`)."""

from __future__ import annotations

import threading
import time

import pytest

from relax.engine.protocol import parse_weight_version
from relax.engine.rollout.engine_client import EngineClient
from relax.utils.http_utils import run_closing
from tests.conformance.target import Target, endpoints

PROMPT = [5, 6, 7, 8]
LONG = 900  # tokens: long enough to be caught running (the tiny model's context is 1024)
MODEL_INFO_KEYS = {"model_path", "tokenizer_path", "is_generation", "preferred_sampling_params", "weight_version",
                   "has_image_understanding", "has_audio_understanding", "model_type", "architectures"}
PAUSED = {"message": "Generation paused successfully.", "status": "ok"}
CONTINUED = {"message": "Generation continued successfully.", "status": "ok"}


class InFlight:
    """One long greedy /generate running in a thread."""

    def __init__(self, target: Target, rid: str, max_new_tokens: int = LONG):
        self.result: tuple[int, object] | None = None
        body = {"input_ids": PROMPT, "rid": rid, "return_logprob": True,
                "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0.0, "ignore_eos": True}}
        self.thread = threading.Thread(target=lambda: setattr(self, "result", target.call("POST", "/generate", body)))
        self.thread.start()
        time.sleep(0.3)

    def answer(self, timeout: float = 60.0) -> dict:
        self.thread.join(timeout)
        assert self.result is not None, f"/generate did not answer within {timeout} s"
        status, body = self.result
        assert status == 200, f"/generate answered {status}: {body}"
        return body


def client(target: Target) -> EngineClient:
    return EngineClient(target.url, control_timeout=60.0)


@endpoints("/health", "/health_generate")
def test_health(target: Target) -> None:
    assert target.call("GET", "/health") == (200, "")
    assert target.call("GET", "/health_generate") == (200, "")
    assert run_closing(client(target).health()) is True


@endpoints("/model_info", "/get_model_info")
def test_model_info(target: Target) -> None:
    for path in ("/model_info", "/get_model_info"):
        status, info = target.call("GET", path)
        assert status == 200 and isinstance(info, dict), f"{path}: {status}"
        assert set(info) == MODEL_INFO_KEYS, f"{path} keys differ: {sorted(set(info) ^ MODEL_INFO_KEYS)}"
        assert isinstance(info["weight_version"], str), f"{path} weight_version {info['weight_version']!r}"
        assert info["is_generation"] is True
    version = run_closing(client(target).weight_version())
    assert version is None or isinstance(version, int), f"weight_version parsed as {version!r}"


@endpoints("/server_info", "/get_server_info")
def test_server_info(target: Target) -> None:
    info = run_closing(client(target).server_info())
    assert isinstance(info, dict), f"server_info {type(info).__name__}"
    for key in ("tp_size", "model_path", "weight_version", "version", "kv_events"):
        assert key in info, f"server_info lacks {key}"
    assert int(info.get("tp_size", 1) or 1) == 1, f"tp_size {info.get('tp_size')!r}"  # as ExternalEngines reads it
    assert isinstance(info["version"], str)
    assert ("relax_engine" in info) is not target.live, "relax_engine tells relax the server is the embedded one"
    status, older = target.call("GET", "/get_server_info")
    assert status == 200 and older.get("tp_size") == info["tp_size"]


@endpoints("/get_weight_version")
def test_get_weight_version(target: Target) -> None:
    status, body = target.call("GET", "/get_weight_version")
    if target.live:
        assert status == 404, f"SGLang 0.5.14 answers 404 here, got {status}"
    else:  # kept for clients of SGLang before 0.5.10 (docs/engine_api.md); relax reads /model_info
        assert status == 200 and parse_weight_version(body["weight_version"]) is not None


@endpoints("/flush_cache")
def test_flush_cache(target: Target) -> None:
    for method in ("GET", "POST"):
        status, text = target.call(method, "/flush_cache", {} if method == "POST" else None)
        assert status == 200 and isinstance(text, str) and text.startswith("Cache flushed."), f"{method}: {status} {text!r}"
    assert run_closing(client(target).flush_cache()).startswith("Cache flushed.")


@endpoints("/abort_request", "/generate")
def test_abort_one_request_keeps_its_tokens(target: Target) -> None:
    running = InFlight(target, "conf-abort-1")
    assert run_closing(client(target).abort_request("conf-abort-1")) is None  # SGLang answers an empty 200
    answer = running.answer()
    finish = answer["meta_info"]["finish_reason"]
    assert finish["type"] == "abort", f"finish_reason {finish!r}"
    assert {"message", "status_code", "err_type"} <= set(finish), f"abort finish_reason keys {sorted(finish)}"
    assert len(answer["output_ids"]) < LONG
    assert len(answer["meta_info"]["output_token_logprobs"]) == len(answer["output_ids"])


@endpoints("/abort_request")
def test_abort_all_and_no_op_aborts(target: Target) -> None:
    running = InFlight(target, "conf-abort-all")
    assert run_closing(client(target).abort_request(abort_all=True)) is None
    assert running.answer()["meta_info"]["finish_reason"]["type"] == "abort"
    assert target.call("POST", "/abort_request", {"rid": "conf-no-such-rid"}) == (200, "")
    assert target.call("POST", "/abort_request", {}) == (200, ""), "SGLang ignores an abort naming nothing"


@endpoints("/pause_generation", "/continue_generation", "/generate")
def test_pause_abort_mode_aborts_and_holds_new_requests(target: Target) -> None:
    running = InFlight(target, "conf-pause-abort")
    try:
        assert run_closing(client(target).pause_generation("abort")) == PAUSED
        assert running.answer()["meta_info"]["finish_reason"]["type"] == "abort"
        held = InFlight(target, "conf-held", max_new_tokens=2)
        assert held.result is None, "a request sent while paused was answered before continue_generation"
        assert run_closing(client(target).continue_generation()) == CONTINUED
        assert held.answer()["meta_info"]["finish_reason"] == {"type": "length", "length": 2}
    finally:  # a failed check must not leave the server paused for every later one
        run_closing(client(target).continue_generation())


@endpoints("/pause_generation", "/continue_generation")
def test_pause_in_place_keeps_running_requests(target: Target) -> None:
    running = InFlight(target, "conf-pause-in-place")  # LONG tokens: a GPU decodes 200 within InFlight's 0.3 s
    try:
        assert running.result is None, "the request finished before the pause: too short to test pausing"
        assert run_closing(client(target).pause_generation("in_place")) == PAUSED
        time.sleep(0.3)
        assert running.result is None, "a request paused in place finished while paused"
        assert target.call("POST", "/continue_generation", {"torch_empty_cache": False}) == (200, CONTINUED)
        assert running.answer()["meta_info"]["finish_reason"] == {"type": "length", "length": LONG}
    finally:  # a failed check must not leave the server paused for every later one
        run_closing(client(target).continue_generation())


def _memory_saver(target: Target) -> None:
    if target.live:
        status, info = target.call("GET", "/server_info")
        if not info.get("enable_memory_saver"):
            pytest.skip("the live server runs without --enable-memory-saver")


@endpoints("/release_memory_occupation", "/resume_memory_occupation", "/generate")
def test_release_and_resume_kv_cache(target: Target) -> None:
    _memory_saver(target)
    c = client(target)
    assert run_closing(c.release_memory_occupation(["kv_cache"])) is None  # SGLang answers null
    assert run_closing(c.resume_memory_occupation(["kv_cache"])) is None
    status, answer = target.call("POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and len(answer["output_ids"]) <= 2
