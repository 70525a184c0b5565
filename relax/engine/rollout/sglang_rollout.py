"""Default rollout: prompts from the data source -> engines -> rewards.

The dotted path ``relax.engine.rollout.sglang_rollout.generate_rollout`` is the default of
``--rollout-function-path`` and ``GenerateState`` is what Relax recipes import, so both keep
their Relax names and call shapes.

Reproducibility: each sample's sampling seed is derived from ``--rollout-seed``, the rollout
id and the sample's running index, so a resumed run samples exactly what the straight run
sampled, whatever the batch composition or number of engines.

Only the seed-fixed entry point `generate_rollout` sees ``args``; it builds the `RolloutConfig` and
`RewardConfig` slices that everything below it takes.
"""

from __future__ import annotations

import asyncio
import time
from argparse import Namespace
from typing import Any

from relax.data.multimodal import media_request_fields
from relax.engine.protocol import parse_weight_version
from relax.engine.rewards.config import RewardConfig
from relax.engine.rollout.config import RolloutConfig
from relax.engine.rollout.partial_rollout import generate_partial_rollout_async
from relax.engine.rollout.prompt_input import prompt_fields, take_prompt_ids
from relax.engine.rollout.state import (  # noqa: F401 - GenerateState, sample_seed: their Relax import paths
    FINISH_STATUS,
    MAX_SAMPLING_ROUNDS,
    GenerateState,
    dynamic_filter,
    sample_seed,
)
from relax.observability.spans import RECORDER, wall
from relax.utils.fault_hooks import fault_at
from relax.utils.gather import gather_or_cancel
from relax.utils.json_codec import logprob
from relax.utils.plugins import HookTimeout, bounded
from relax.utils.types import Sample


def apply_response(sample: Sample, response: dict[str, Any]) -> Sample:
    """Fill a sample from an SGLang-shaped /generate response (tokens, text, log-probs, status)."""
    meta = response["meta_info"]
    output_ids = list(response["output_ids"])
    sample.tokens = list(sample.tokens) + output_ids
    sample.response_length = len(output_ids)
    sample.response = response.get("text", "")
    sample.rollout_log_probs = [logprob(item[0]) for item in meta.get("output_token_logprobs", [])]
    sample.loss_mask = [1] * len(output_ids)
    sample.status = FINISH_STATUS[meta["finish_reason"]["type"]]
    sample.weight_version = parse_weight_version(meta.get("weight_version"))
    sample.token_weight_versions = [sample.weight_version] * len(output_ids)
    sample.rollout_routed_experts = meta.get("routed_experts")  # asked for by --use-rollout-routing-replay
    return sample

ENGINE_ABORTED = "engine_aborted"


async def generate_rollout_async(cfg: RolloutConfig, rewards: RewardConfig, rollout_id: int,
                                 data_source: Any) -> list[list[Sample]]:
    """Draw, generate and score groups until ``--rollout-batch-size`` of them pass the dynamic filter.

    Groups are drawn ``--over-sampling-batch-size`` at a time. A group the filter rejects gets the
    fate ``filtered`` (with the filter's reason); groups kept beyond the target go back to the data
    source as prompts (fate ``recycled``) and are generated again later, so nothing is lost. So does a group
    with a sample an engine aborted (it left the run: relax/core/elastic.py), with the reason ``engine_aborted``.
    """
    state = GenerateState(cfg.args, config=cfg)
    target = cfg.rollout_batch_size
    keep_fn = dynamic_filter(cfg)
    kept: list[list[Sample]] = []
    for _ in range(MAX_SAMPLING_ROUNDS):
        groups = data_source.get_samples(cfg.draw_size)
        await _generate_and_score(cfg, rewards, rollout_id, state, groups)
        for group in groups:
            if any(s.status is Sample.Status.ABORTED for s in group):  # its engine left the run (scale-in)
                state.record(rollout_id, group, "recycled", ENGINE_ABORTED)
                data_source.add_samples([[_as_prompt(s) for s in group]])
                continue
            keep, reason = keep_fn(group)
            if keep:
                kept.append(group)
            else:
                state.record(rollout_id, group, "filtered", reason or "dynamic_sampling_filter")
        if len(kept) >= target:
            break
    else:
        raise RuntimeError(f"dynamic sampling kept {len(kept)} of {target} groups after {MAX_SAMPLING_ROUNDS} rounds "
                           f"of {cfg.draw_size}; check --dynamic-sampling-filter-path")
    surplus = kept[target:]
    for group in surplus:
        state.record(rollout_id, group, "recycled", "over_sampling_surplus")
    data_source.add_samples([[_as_prompt(s) for s in group] for group in surplus])
    return kept[:target]


def _as_prompt(sample: Sample) -> Sample:
    """A generated sample reset to its prompt, to be generated again (same index: same seed)."""
    prompt = sample.copy()
    prompt.tokens = prompt.tokens[: prompt.prompt_length]
    prompt.response, prompt.response_length, prompt.reward = "", 0, None
    prompt.loss_mask = prompt.rollout_log_probs = prompt.teacher_log_probs = prompt.token_weight_versions = None
    prompt.status, prompt.weight_version, prompt.rollout_routed_experts = Sample.Status.PENDING, None, None
    prompt.abort_count += 1
    return prompt


async def _generate_and_score(cfg: RolloutConfig, rewards: RewardConfig, rollout_id: int, state: GenerateState,
                              groups: list[list[Sample]]) -> None:
    from relax.engine.rewards import compute_rewards

    flat = [s for g in groups for s in g]
    start = time.perf_counter()
    if cfg.custom_generate_function_path:
        await _custom_generate(cfg, rollout_id, state, flat)
    else:
        await _batch_generate(cfg, rollout_id, state, flat)
    generated = time.perf_counter()
    state.add_seconds(rollout_id, "perf/rollout_generate_time_s", generated - start)
    if fault_at("REWARD_RAISE", rollout_id):
        raise RuntimeError(f"reward function raised (injected fault at step {rollout_id})")
    await compute_rewards(rewards, flat)
    if rewards.genrm.enabled:
        from relax.engine.rewards.genrm import genrm_metrics

        state.add_metrics(rollout_id, genrm_metrics(flat))
    state.add_seconds(rollout_id, "perf/rollout_reward_time_s", time.perf_counter() - generated)
    RECORDER.record("generate", "engines", wall(start), wall(generated), step=rollout_id, samples=len(flat))
    RECORDER.record("reward", "reward", wall(generated), time.time(), step=rollout_id, samples=len(flat))


GENERATE_SIGNATURE = "async generate(args, sample: Sample, sampling_params: dict[, evaluation: bool]) -> Sample"


def load_generate_function(path: str) -> tuple[Any, bool]:
    """The ``--custom-generate-function-path`` function, and whether it takes seed 001's optional ``evaluation``."""
    import inspect

    from relax.utils.plugins import load_function

    fn = load_function(path, flag="--custom-generate-function-path", signature=GENERATE_SIGNATURE, min_args=3)
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn, False
    return fn, "evaluation" in params or any(p.kind == p.VAR_KEYWORD for p in params.values())


async def custom_generate(cfg: RolloutConfig, flat: list[Sample], params: dict[str, Any], seeds: list[int], *,
                          evaluation: bool = False) -> None:
    """Relax's custom generate hook (multi-turn, tools): one call per sample, talking HTTP to the engine.

    Each call gets the seeds' ``args`` (``cfg.args``) and the rollout's sampling params with the sample's own
    ``sampling_seed``; during evaluation a function that declares ``evaluation`` gets ``evaluation=True`` (seed 001).
    """
    path = cfg.custom_generate_function_path
    fn, takes_evaluation = load_generate_function(path)
    extra = {"evaluation": True} if evaluation and takes_evaluation else {}

    async def call(i: int, s: Sample, seed: int) -> Any:
        which = f"eval sample {i}" if evaluation else f"sample index {s.index} (group {s.group_index})"
        try:
            return await bounded("--custom-generate-function-path", path, cfg.hook_timeout, fn, cfg.args, s,
                                 dict(params, sampling_seed=seed), detail=which, **extra)
        except HookTimeout:
            raise
        except Exception as exc:
            exc.add_note(f"in --custom-generate-function-path {path} ({which})")
            raise

    results = await gather_or_cancel(*(call(i, s, seed) for i, (s, seed) in enumerate(zip(flat, seeds, strict=True))))
    for s, out in zip(flat, results, strict=True):
        if out is not s and not isinstance(out, Sample):
            raise TypeError(f"--custom-generate-function-path {path} returned "
                            f"{type(out).__name__} for sample {s.index}; expected {GENERATE_SIGNATURE}")
        if isinstance(out, Sample) and out is not s:
            s.__dict__.update(out.__dict__)
        if isinstance(s.weight_version, str):  # copied from an engine's meta_info, where SGLang reports a string
            s.weight_version = parse_weight_version(s.weight_version)
        if s.loss_mask is not None and len(s.loss_mask) != s.response_length:
            raise ValueError(f"--custom-generate-function-path {path}: sample "
                             f"{s.index} has {len(s.loss_mask)} loss-mask entries for {s.response_length} "
                             "response tokens")


async def _custom_generate(cfg: RolloutConfig, rollout_id: int, state: GenerateState, flat: list[Sample]) -> None:
    seeds = [sample_seed(cfg.rollout_seed, rollout_id, s.index) for s in flat]
    await custom_generate(cfg, flat, state.sampling_params, seeds)


async def _batch_generate(cfg: RolloutConfig, rollout_id: int, state: GenerateState, flat: list[Sample]) -> None:
    requests = []
    for s in flat:
        params = dict(state.sampling_params, sampling_seed=sample_seed(cfg.rollout_seed, rollout_id, s.index))
        request = {**prompt_fields(s, cfg.use_slime_router, state.image_pad_id), "sampling_params": params,
                   "return_logprob": True}
        request.update(media_request_fields(s.multimodal_inputs))  # SGLang's image_data / video_data
        if cfg.use_rollout_routing_replay:  # every fed token's experts, the prompt's too (start 0)
            request["return_routed_experts"] = True
        requests.append(request)
    responses = await state.pool.generate_batch(requests, cfg.n_samples_per_prompt)
    for s, resp in zip(flat, responses, strict=True):
        take_prompt_ids(s, resp, cfg.use_slime_router)
        apply_response(s, resp)
    latencies = [r["meta_info"]["e2e_latency"] for r in responses
                 if isinstance(r["meta_info"].get("e2e_latency"), int | float)]
    if latencies:  # the engines' own time (SGLang's meta_info): generation time minus this is the HTTP path's
        state.add_seconds(rollout_id, "perf/rollout_engine_time_s", max(latencies))


# seed hook: seed 000's --rollout-function-path default, generate_rollout(args, rollout_id, data_source, evaluation)
def generate_rollout(args: Namespace, rollout_id: int, data_source: Any, evaluation: bool = False) -> list[list[Sample]]:
    """Generate one rollout batch of ``--rollout-batch-size`` groups with rewards (Relax signature)."""
    if evaluation:
        raise ValueError("generate_rollout(evaluation=True): evaluation runs from --eval-interval/--eval-prompt-data "
                         "(relax.engine.rollout.evaluation.run_eval)")
    from relax.utils.http_utils import close_session

    cfg, rewards = RolloutConfig.from_args(args), RewardConfig.from_args(args)

    async def run() -> list[list[Sample]]:
        try:
            if cfg.partial_rollout:
                return await generate_partial_rollout_async(cfg, rewards, rollout_id, data_source)
            return await generate_rollout_async(cfg, rewards, rollout_id, data_source)
        finally:
            await close_session()  # this loop ends here; custom generate functions may have opened a session

    return asyncio.run(run())
