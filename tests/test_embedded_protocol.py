"""The embedded engine answers as SGLang 0.5.14 does where it mirrors it (relax/engine/protocol.py):
its request fields, its ``/weights_checker`` (GET or POST, ``checksum`` by default, SGLang's answer shape),
``torch_empty_cache``, ``return_prompt_token_ids``, null sampling parameters and the ``meta_info`` keys.
docs/engine_api.md ("From 0.5.10.post1 to 0.5.14") lists the changes."""

from __future__ import annotations

import hashlib
import json
import urllib.error
import urllib.request

import pytest
import torch

from relax.backends.embedded.launch import EngineProcess
from relax.backends.embedded.weights_checker import ONE_RANK
from relax.engine.protocol import ENDPOINTS_BY_PATH
from relax.weights import serialized_tensors
from relax.weights.checksum import state_checksums

torch.set_num_threads(1)
SEED = 1234
# meta_info keys SGLang 0.5.14 sends for a plain-text generation (tokenizer_manager.py: _handle_batch_output,
# add_logprob_to_meta_info), of which this engine's answer must be a subset
SGLANG_META_KEYS = {"id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
                    "completion_tokens", "cached_tokens", "e2e_latency", "input_token_logprobs",
                    "output_token_logprobs", "output_token_logprobs_length"}


@pytest.fixture(scope="module")
def engine():
    proc = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3", "--seed", str(SEED)])
    yield proc
    proc.stop()


def call(engine, method: str, path: str, body: dict | None = None) -> tuple[int, object]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(engine.url + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            raw, status = resp.read(), resp.status
    except urllib.error.HTTPError as exc:
        raw, status = exc.read(), exc.code
    return status, json.loads(raw) if raw.strip() else None


def tiny_state() -> dict[str, torch.Tensor]:
    from relax.models import build_model

    return build_model("tiny-qwen3", seed=SEED).state_dict()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_weights_checker_checksum_is_the_default_with_sglangs_shape(engine, method) -> None:
    status, answer = call(engine, method, "/weights_checker", None if method == "GET" else {})
    assert status == 200 and answer["success"]
    assert set(answer) == {"success", "message", "ranks", "per_engine_checksum", "checksums"}
    (rank,) = answer["ranks"]
    assert set(rank) == {"checksums", "per_gpu_checksum", "parallelism_info"} and rank["parallelism_info"] == ONE_RANK
    assert rank["checksums"] == answer["checksums"] == state_checksums(tiny_state().items())
    h = hashlib.sha256()
    for name in sorted(rank["checksums"]):  # SGLang's per_gpu_checksum, then its per_engine_checksum
        h.update(name.encode())
        h.update(rank["checksums"][name].encode())
    assert rank["per_gpu_checksum"] == h.hexdigest()
    assert answer["per_engine_checksum"] == hashlib.sha256(rank["per_gpu_checksum"].encode()).hexdigest()


def test_weights_checker_unknown_action_answers_as_sglang(engine) -> None:
    status, answer = call(engine, "POST", "/weights_checker", {"action": "explode"})
    assert status == 400 and answer["success"] is False and answer["message"].startswith("Unsupported action='explode'")


def test_torch_empty_cache_is_accepted_where_0_5_14_has_it(engine) -> None:
    state = tiny_state()
    name = next(iter(state))
    item = serialized_tensors.encode_named_tensors([(name, state[name])])  # the value it holds: nothing changes
    for value in (True, False):
        status, answer = call(engine, "POST", "/update_weights_from_tensor",
                              {"serialized_named_tensors": [item], "torch_empty_cache": value})
        assert status == 200 and answer["success"], answer
    for body in ({}, {"torch_empty_cache": False}):
        assert call(engine, "POST", "/continue_generation", body) == (
            200, {"message": "Generation continued successfully.", "status": "ok"})
    assert ENDPOINTS_BY_PATH["/continue_generation"].fields["torch_empty_cache"] is True


def test_generate_answers_0_5_14s_keys(engine) -> None:
    body = {"input_ids": [5, 6, 7], "return_logprob": True, "return_prompt_token_ids": True,
            "sampling_params": {"max_new_tokens": 4, "sampling_seed": 3, "temperature": None, "min_p": None, "n": None,
                                "repetition_penalty": None, "stop_token_ids": [None, 2]}}
    status, answer = call(engine, "POST", "/generate", body)
    assert status == 200, answer
    assert answer["prompt_token_ids"] == [5, 6, 7]
    meta = answer["meta_info"]
    assert set(meta) <= SGLANG_META_KEYS and "total_retractions" not in meta
    assert meta["num_retractions"] == 0 and meta["output_token_logprobs_length"] == len(answer["output_ids"])
    status, plain = call(engine, "POST", "/generate", {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 2}})
    assert status == 200 and "prompt_token_ids" not in plain
    status, refused = call(engine, "POST", "/generate", {"input_ids": [5], "sampling_params": {"min_p": 0.1}})
    assert status == 400 and "min_p" in refused["error"]["message"]


def test_server_info_has_kv_events(engine) -> None:
    status, info = call(engine, "GET", "/server_info")
    assert status == 200 and "kv_events" in info and info["kv_events"] is None
