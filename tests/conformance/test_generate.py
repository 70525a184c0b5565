"""``/generate`` as relax sends it and reads it: the rollout's sampling params, a batched body, log-probs,
finish reasons and the ``meta_info`` fields, each answer read by relax's own parsers."""

from __future__ import annotations

import math

from relax.engine.rollout.engine_pool import _batched
from relax.engine.rollout.opd_teacher import response_log_probs, teacher_request
from relax.engine.rollout.partial_samples import append_response
from relax.engine.rollout.sglang_rollout import apply_response
from relax.engine.rollout.state import FINISH_STATUS
from relax.utils.types import Sample
from tests.conformance.target import Target, endpoints

PROMPT = [5, 6, 7, 8]
# meta_info keys SGLang 0.5.14 always sends (tokenizer_manager._handle_batch_output), and with return_logprob
META_KEYS = {"id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions", "reasoning_tokens",
             "completion_tokens", "cached_tokens"}
LOGPROB_KEYS = {"input_token_logprobs", "output_token_logprobs", "output_token_logprobs_length"}


def generate(target: Target, body: dict) -> dict | list:
    status, answer = target.call("POST", "/generate", body)
    assert status == 200, f"/generate answered {status}: {answer}"
    return answer


def greedy(n: int, **extra) -> dict:
    return {"input_ids": PROMPT, "return_logprob": True,
            "sampling_params": {"max_new_tokens": n, "temperature": 0.0, "ignore_eos": True, **extra}}


def check_logprob_entries(entries: list, ids: list[int], where: str) -> None:
    assert isinstance(entries, list) and len(entries) == len(ids), f"{where}: {len(entries)} entries for {len(ids)} ids"
    for i, (entry, token) in enumerate(zip(entries, ids, strict=True)):
        assert isinstance(entry, list) and len(entry) == 3, f"{where}[{i}]: {entry!r} is not [logprob, token_id, text]"
        value, token_id, text = entry
        assert token_id == token, f"{where}[{i}] token_id {token_id} != output_ids[{i}] {token}"
        assert value is None or (isinstance(value, int | float) and value <= 1e-3), f"{where}[{i}] logprob {value!r}"
        assert text is None or isinstance(text, str), f"{where}[{i}] text {text!r}"


@endpoints("/generate")
def test_answer_shape_and_meta_info(target: Target) -> None:
    answer = generate(target, greedy(4))
    assert {"text", "output_ids", "meta_info"} <= set(answer), f"answer keys {sorted(answer)}"
    assert "prompt_token_ids" not in answer, "prompt_token_ids without return_prompt_token_ids"
    ids, meta = answer["output_ids"], answer["meta_info"]
    assert isinstance(answer["text"], str), f"text {answer['text']!r}"
    assert len(ids) == 4 and all(isinstance(t, int) for t in ids), f"output_ids {ids!r}"
    assert META_KEYS | LOGPROB_KEYS <= set(meta), f"meta_info lacks {sorted((META_KEYS | LOGPROB_KEYS) - set(meta))}"
    assert meta["finish_reason"] == {"type": "length", "length": 4}, f"finish_reason {meta['finish_reason']!r}"
    assert meta["prompt_tokens"] == len(PROMPT), f"prompt_tokens {meta['prompt_tokens']!r}"
    assert meta["completion_tokens"] == 4, f"completion_tokens {meta['completion_tokens']!r}"
    assert isinstance(meta["weight_version"], str), f"weight_version {meta['weight_version']!r} is not a string"
    assert isinstance(meta["id"], str) and meta["num_retractions"] == 0, f"id/num_retractions {meta['id']!r}"
    assert isinstance(meta["cached_tokens"], int), f"cached_tokens {meta['cached_tokens']!r}"
    assert meta["output_token_logprobs_length"] == 4, f"output_token_logprobs_length {meta['output_token_logprobs_length']}"
    check_logprob_entries(meta["output_token_logprobs"], ids, "output_token_logprobs")
    if "e2e_latency" in meta:  # relax reads it where present (perf/rollout_engine_time_s)
        assert isinstance(meta["e2e_latency"], int | float), f"e2e_latency {meta['e2e_latency']!r}"
    sample = apply_response(Sample(tokens=list(PROMPT)), answer)
    assert sample.tokens == PROMPT + ids and sample.response_length == 4
    assert sample.status == Sample.Status.TRUNCATED and len(sample.rollout_log_probs) == 4
    assert all(math.isfinite(v) for v in sample.rollout_log_probs), f"log-probs {sample.rollout_log_probs}"


@endpoints("/generate")
def test_rollout_sampling_params_and_seed(target: Target) -> None:
    """The rollout's params as `RolloutConfig.sampling_params` builds them (``stop``/``stop_token_ids`` null)."""
    params = {"temperature": 1.0, "top_p": 0.9, "top_k": 20, "max_new_tokens": 3, "stop": None, "stop_token_ids": None,
              "skip_special_tokens": True, "sampling_seed": 11, "ignore_eos": True}
    answer = generate(target, {"input_ids": PROMPT, "sampling_params": params, "return_logprob": True, "rid": "conf-seed"})
    assert len(answer["output_ids"]) == 3 and answer["meta_info"]["id"] == "conf-seed", answer["meta_info"].get("id")
    for null_is_default in ({"temperature": None, "top_p": None, "top_k": None, "min_p": None},):
        answer = generate(target, {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2, **null_is_default}})
        assert answer["meta_info"]["finish_reason"]["type"] in FINISH_STATUS


@endpoints("/generate")
def test_batched_body_answers_a_list_in_order(target: Target) -> None:
    """The body `engine_pool._batched` sends: per-item input_ids, sampling_params, rid, return_logprob."""
    singles = [{"input_ids": PROMPT[: 2 + i], "rid": f"conf-batch-{i}", "return_logprob": True,
                "sampling_params": {"max_new_tokens": 2 + i, "temperature": 0.0, "ignore_eos": True}} for i in range(3)]
    answers = generate(target, _batched(singles))
    assert isinstance(answers, list) and len(answers) == 3, f"a batch of 3 answered {type(answers).__name__}"
    for i, answer in enumerate(answers):
        assert len(answer["output_ids"]) == 2 + i, f"item {i}: {len(answer['output_ids'])} tokens"
        assert answer["meta_info"]["prompt_tokens"] == 2 + i and answer["meta_info"]["id"] == f"conf-batch-{i}"


@endpoints("/generate")
def test_stop_token_ids_and_no_stop_trim(target: Target) -> None:
    ids = generate(target, greedy(16))["output_ids"]
    stop = ids[1]
    first = ids.index(stop)
    for trim in (False, True):
        answer = generate(target, greedy(16, ignore_eos=False, stop_token_ids=[stop], no_stop_trim=not trim))
        meta, out = answer["meta_info"], answer["output_ids"]
        if meta["finish_reason"]["type"] == "stop" and meta["finish_reason"].get("matched") != stop:
            continue  # the model's own EOS came first
        assert meta["finish_reason"] == {"type": "stop", "matched": stop}, f"finish_reason {meta['finish_reason']!r}"
        assert out[-1] == stop and stop not in out[:-1], f"output_ids {out} for stop token {stop}"
        assert len(out) <= first + 1 + 2, f"stopped at {len(out)}, greedy reached {stop} at {first}"
        assert meta["completion_tokens"] == len(out), f"completion_tokens {meta['completion_tokens']} for {len(out)} ids"
        assert FINISH_STATUS[meta["finish_reason"]["type"]] == Sample.Status.COMPLETED


@endpoints("/generate")
def test_logprob_start_len_as_the_opd_teacher_asks(target: Target) -> None:
    """`opd_teacher.teacher_request` (max_new_tokens 0, logprob_start_len) read by `response_log_probs`."""
    answer = generate(target, {"input_ids": PROMPT, "return_logprob": True,
                               "sampling_params": {"max_new_tokens": 5, "temperature": 1.0, "sampling_seed": 3,
                                                   "ignore_eos": True}})
    sample = apply_response(Sample(tokens=list(PROMPT)), answer)
    scored = generate(target, teacher_request(sample, 1.0))
    assert scored["output_ids"] == [] and scored["meta_info"]["completion_tokens"] == 0, scored["meta_info"]
    entries = scored["meta_info"]["input_token_logprobs"]
    assert len(entries) == len(sample.tokens) - (len(PROMPT) - 1), f"{len(entries)} input_token_logprobs entries"
    values = response_log_probs(scored, sample.response_length, target.url)
    tol = 0.1 if target.live else 1e-3  # bf16 prefill vs decode on the GPU
    assert all(abs(a - b) <= tol for a, b in zip(values, sample.rollout_log_probs, strict=True)), \
        f"prompt log-probs {values} vs generation's {sample.rollout_log_probs}"


@endpoints("/generate")
def test_resumed_segment_appends(target: Target) -> None:
    """A partial rollout's continuation (`partial_samples.append_response`)."""
    sample = apply_response(Sample(tokens=list(PROMPT)), generate(target, greedy(2)))
    more = generate(target, {"input_ids": sample.tokens, "return_logprob": True, "rid": "conf-resume",
                             "sampling_params": {"max_new_tokens": 3, "temperature": 0.0, "ignore_eos": True}})
    append_response(sample, more)
    assert sample.response_length == 5 and len(sample.rollout_log_probs) == 5 and len(sample.loss_mask) == 5
