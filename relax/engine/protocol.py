"""SGLang's native HTTP API as data: every request body we send or serve, field for field.

The engine contract (DESIGN.md) is SGLang's own protocol. These tables pin the request
dataclasses of ``sglang/srt/managers/io_struct.py`` and the sampling parameters of
``sglang/srt/sampling/sampling_params.py`` at ``SGLANG_VERSION``: each field's name and default.
They are facts about SGLang, kept apart from what our engines implement:

* the embedded server answers 400 for a field it does not know, and for a known field it does not
  implement unless the value is SGLang's default (which is what it does anyway);
* the client builds its requests from these names, so what it sends a real SGLang server is what
  SGLang expects;
* ``tests/sglang/`` checks these tables against the real ``sglang`` package where it is installed
  (the GPU image, ``nox -s sglang_conformance``), and ``tests/test_protocol.py`` against SGLang's source
  read as text wherever it is at hand (``RELAX_SGLANG_SOURCE``: an unpacked wheel).

docs/engine_api.md ("From 0.5.10.post1 to 0.5.14") lists what the last re-pin changed.

``REQUIRED`` marks a field without a default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SGLANG_VERSION = "0.5.14"
REQUIRED = object()

# BaseReq: every request input carries these (kw_only)
BASE_REQ: dict[str, Any] = {"rid": None, "http_worker_ipc": None}

GENERATE_REQ: dict[str, Any] = {
    **BASE_REQ,
    "text": None, "input_ids": None, "input_embeds": None, "image_data": None, "video_data": None,
    "audio_data": None, "mm_hashes": None, "use_audio_in_video": False, "sampling_params": None,
    "return_logprob": None, "logprob_start_len": None, "top_logprobs_num": None, "token_ids_logprob": None,
    "return_text_in_logprobs": False, "stream": False, "log_metrics": True, "return_hidden_states": False,
    "return_routed_experts": False, "return_indexer_topk": False, "routed_experts_start_len": 0,
    "modalities": None, "session_params": None, "lora_path": None, "lora_id": None,
    "custom_logit_processor": None, "positional_embed_overrides": None, "bootstrap_host": None,
    "bootstrap_port": None, "bootstrap_room": None, "bootstrap_pair_key": None, "decode_tp_size": None,
    "require_reasoning": False, "routed_dp_rank": None, "disagg_prefill_dp_rank": None,
    "data_parallel_rank": None, "background": False, "conversation_id": None, "priority": None,
    "extra_key": None, "routing_key": None, "no_logs": False, "custom_labels": None, "return_bytes": False,
    "return_entropy": False, "return_prompt_token_ids": False, "external_trace_header": None,
    "received_time": None, "need_wait_for_mm_inputs": None, "num_items_assigned": None,
    "mm_data_mooncake": None, "encoder_urls": None, "max_dynamic_patch": None, "min_dynamic_patch": None,
    "image_max_dynamic_patch": None, "video_max_dynamic_patch": None, "multi_item_delimiter_indices": None,
}

SAMPLING_PARAMS: dict[str, Any] = {
    "max_new_tokens": 128, "stop": None, "stop_token_ids": None, "stop_regex": None, "temperature": 1.0,
    "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0, "presence_penalty": 0.0,
    "repetition_penalty": 1.0, "min_new_tokens": 0, "n": 1, "json_schema": None, "regex": None, "ebnf": None,
    "structural_tag": None, "ignore_eos": False, "skip_special_tokens": True,
    "spaces_between_special_tokens": True, "no_stop_trim": False, "custom_params": None,
    "stream_interval": None, "logit_bias": None, "sampling_seed": None,
}
# SamplingParams.__init__ (since 0.5.14) replaces None by the default for these, so /generate may send null
SAMPLING_NONE_IS_DEFAULT = frozenset({
    "temperature", "top_p", "top_k", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty",
    "min_new_tokens", "n", "ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim",
})


@dataclass(frozen=True)
class Endpoint:
    """One endpoint of SGLang's HTTP server (``sglang/srt/entrypoints/http_server.py``)."""

    path: str
    methods: tuple[str, ...]
    request: str | None  # the io_struct dataclass of its body, None for no body
    fields: dict[str, Any] = field(default_factory=dict)  # the body's fields and their defaults
    note: str = ""


_WEIGHTS_COMMON = {"flush_cache": True, "abort_all_requests": False, "weight_version": None}

ENDPOINTS: tuple[Endpoint, ...] = (
    Endpoint("/generate", ("POST", "PUT"), "GenerateReqInput", GENERATE_REQ),
    Endpoint("/health", ("GET",), None, note="200 once the server is up (no generation unless "
             "SGLANG_ENABLE_HEALTH_ENDPOINT_GENERATION)"),
    Endpoint("/health_generate", ("GET",), None, note="generates one token when the server is idle"),
    Endpoint("/model_info", ("GET",), None, note="model_path, is_generation, weight_version, ... (where "
             "relax reads the served version)"),
    Endpoint("/get_model_info", ("GET",), None, note="deprecated alias of /model_info"),
    Endpoint("/server_info", ("GET",), None, note="the ServerArgs as a dict, plus internal_states, version and "
             "kv_events"),
    Endpoint("/get_server_info", ("GET",), None, note="deprecated alias of /server_info"),
    Endpoint("/get_weight_version", ("GET",), None, note="SGLang 0.5.10 and 0.5.14 answer 404 here and at "
             "/weight_version (use /model_info); older SGLang returned {weight_version}"),
    Endpoint("/flush_cache", ("GET", "POST"), "FlushCacheReqInput", {**BASE_REQ, "timeout_s": None},
             note="SGLang reads the timeout from the query string (?timeout=)"),
    Endpoint("/abort_request", ("POST",), "AbortReq",
             {**BASE_REQ, "abort_all": False, "finished_reason": None, "abort_message": None}),
    Endpoint("/pause_generation", ("POST",), "PauseGenerationReqInput", {**BASE_REQ, "mode": "abort"}),
    Endpoint("/continue_generation", ("POST",), "ContinueGenerationReqInput", {**BASE_REQ, "torch_empty_cache": True},
             note="torch_empty_cache: torch.cuda.empty_cache() before un-pausing"),
    Endpoint("/update_weights_from_tensor", ("POST",), "UpdateWeightsFromTensorReqInput",
             {**BASE_REQ, "serialized_named_tensors": REQUIRED, "load_format": None, **_WEIGHTS_COMMON,
              "disable_draft_model": None, "torch_empty_cache": False}),
    Endpoint("/init_weights_update_group", ("POST",), "InitWeightsUpdateGroupReqInput",
             {**BASE_REQ, "master_address": REQUIRED, "master_port": REQUIRED, "rank_offset": REQUIRED,
              "world_size": REQUIRED, "group_name": "weight_update_group", "backend": "nccl"}),
    Endpoint("/update_weights_from_distributed", ("POST",), "UpdateWeightsFromDistributedReqInput",
             {**BASE_REQ, "names": REQUIRED, "dtypes": REQUIRED, "shapes": REQUIRED,
              "group_name": "weight_update_group", **_WEIGHTS_COMMON, "load_format": None, "torch_empty_cache": False}),
    Endpoint("/destroy_weights_update_group", ("POST",), "DestroyWeightsUpdateGroupReqInput",
             {**BASE_REQ, "group_name": "weight_update_group"}),
    Endpoint("/update_weights_from_disk", ("POST",), "UpdateWeightFromDiskReqInput",
             {**BASE_REQ, "model_path": REQUIRED, "load_format": None, "abort_all_requests": False,
              "weight_version": None, "is_async": False, "torch_empty_cache": False, "keep_pause": False,
              "recapture_cuda_graph": False, "token_step": 0, "flush_cache": True, "manifest": None}),
    Endpoint("/release_memory_occupation", ("GET", "POST"), "ReleaseMemoryOccupationReqInput",
             {**BASE_REQ, "tags": None}, note="tags: weights, kv_cache (and cuda_graph in SGLang)"),
    Endpoint("/resume_memory_occupation", ("GET", "POST"), "ResumeMemoryOccupationReqInput",
             {**BASE_REQ, "tags": None}),
    Endpoint("/weights_checker", ("GET", "POST"), "CheckWeightsReqInput", {**BASE_REQ, "action": "checksum"},
             note="actions: snapshot, reset_tensors, compare, checksum; answers {success, message}, and checksum "
             "adds {ranks, per_engine_checksum}"),
    Endpoint("/start_profile", ("GET", "POST"), "ProfileReqInput",
             {**BASE_REQ, "output_dir": None, "start_step": None, "num_steps": None, "activities": None,
              "profile_by_stage": False, "with_stack": None, "record_shapes": None, "merge_profiles": False,
              "profile_prefix": None, "profile_stages": None},
             note="torch.profiler traces under output_dir; with num_steps it stops by itself after that many "
             "forward steps"),
    Endpoint("/stop_profile", ("GET", "POST"), None, note="stops the profiler and writes its trace"),
)
ENDPOINTS_BY_PATH: dict[str, Endpoint] = {e.path: e for e in ENDPOINTS}

# SGLang's memory tags (sglang/srt/constants.py GPU_MEMORY_TYPE_*)
MEMORY_TAGS = ("weights", "kv_cache", "cuda_graph")
PAUSE_MODES = ("abort", "retract", "in_place")
WEIGHTS_CHECKER_ACTIONS = ("snapshot", "reset_tensors", "compare", "checksum")


def is_default(value: Any, default: Any) -> bool:
    """``value`` equals SGLang's ``default`` (an int where a float is due counts; True never counts as 1)."""
    if default is None or isinstance(default, bool):
        return value is default
    if isinstance(default, int | float):
        return type(value) in (int, float) and value == default
    return value == default


def check_fields(body: dict[str, Any], fields: dict[str, Any], implemented: frozenset[str], where: str,
                 none_is_default: frozenset[str] = frozenset()) -> None:
    """Raise ``ValueError`` naming the first problem: a field SGLang does not have, a required field
    missing, or a field this server does not implement given a value other than SGLang's default
    (``none_is_default``: fields where SGLang reads None as the default)."""
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise ValueError(f"{where}: unknown field(s): {', '.join(unknown)}")
    missing = sorted(k for k, default in fields.items() if default is REQUIRED and k not in body)
    if missing:
        raise ValueError(f"{where}: missing field(s): {', '.join(missing)}")
    for key, value in body.items():
        default = fields[key]
        if value is None and key in none_is_default:
            continue
        if key not in implemented and default is not REQUIRED and not is_default(value, default):
            raise ValueError(f"{where}: {key}={value!r} is not implemented by this engine "
                             f"(only SGLang's default {default!r})")


def weight_version_str(version: int | str | None) -> str | None:
    """SGLang's ``weight_version`` is a string field; our versions are integers."""
    return None if version is None else str(version)


def parse_weight_version(value: Any) -> int | None:
    """An integer version from an engine's ``weight_version`` (``"3"``, 3); None for SGLang's ``"default"``
    (a server whose weights no sync has versioned yet) or a missing value."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.strip().lstrip("-").isdigit():
        return int(value)
    return None
