"""Evaluation rollouts (``--eval-interval``, ``--eval-prompt-data NAME PATH ...`` or ``--eval-config FILE``).

Before every rollout step whose id is a multiple of ``--eval-interval`` (step 0 too, unless
``--skip-eval-before-train``) each eval dataset is generated with the eval sampling flags
(each falls back to its rollout flag) and scored by the training reward. Results are merged
into that step's metrics.jsonl record as ``eval/<name>/reward_mean`` and ``eval/<name>/pass@<n>``
(the share of prompts with at least one correct sample among ``--n-samples-per-eval-prompt``;
labels come from ``--eval-label-key``, else ``--label-key``);
``--log-passrate`` adds the unbiased pass@k for every power of two k < n.
``--eval-min-new-tokens`` goes to the engines as SGLang's ``min_new_tokens``; ``--eval-max-context-len``
cuts each default eval request's ``max_new_tokens`` so prompt + response fit it.
Seeds depend on (rollout seed, step, dataset, sample), so an eval is reproducible. With
``--custom-generate-function-path`` the recipe's function generates the eval samples too, and a
function that declares seed 001's optional ``evaluation`` parameter gets ``evaluation=True``.

What it reads of the flags is three slices the driver builds once: `EvalConfig`, and the rollout's
`RolloutConfig` (fallback sampling, seed, generate hook) and `RewardConfig` (the training reward).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import comb
from typing import Any

from relax.algorithms import extract_reward
from relax.data.dataset import read_records
from relax.data.multimodal import media_request_fields
from relax.data.prompts import build_samples
from relax.engine.rewards import RewardConfig, compute_rewards
from relax.engine.rollout.config import RolloutConfig
from relax.engine.rollout.eval_config import EvalConfig
from relax.engine.rollout.eval_file import load_eval_file
from relax.engine.rollout.prompt_input import prompt_fields, take_prompt_ids
from relax.engine.rollout.sglang_rollout import GenerateState, apply_response, custom_generate, sample_seed
from relax.utils.flag_types import ConfigError
from relax.utils.gather import gather_or_cancel
from relax.utils.types import Sample

EVAL_SEED_OFFSET = 1 << 40  # keeps eval seeds apart from training seeds of the same step


@dataclass
class EvalSet:
    name: str
    prompts: list[Sample]
    n_samples: int | None = None  # --eval-config's per-set n_samples_per_eval_prompt (None: the flag's)
    sampling: dict[str, Any] = field(default_factory=dict)  # --eval-config's per-set sampling overrides


def load_eval_sets(cfg: EvalConfig, tokenizer: Any) -> list[EvalSet]:
    """The sets of ``--eval-config`` when given (relax/engine/rollout/eval_file.py), else of ``--eval-prompt-data``."""
    if cfg.eval_config:
        return [_load_set(cfg, tokenizer, d.name, d.path, d.input_key, d.label_key, d.tool_key, d.max_prompt_len,
                          n_samples=d.n_samples_per_eval_prompt, sampling=d.sampling())
                for d in load_eval_file(cfg.eval_config)]
    items = cfg.eval_prompt_data or []
    if len(items) % 2:
        raise ConfigError("--eval-prompt-data takes pairs: NAME PATH [NAME PATH ...]")
    return [_load_set(cfg, tokenizer, name, path) for name, path in zip(items[::2], items[1::2], strict=True)]


def _load_set(cfg: EvalConfig, tokenizer: Any, name: str, path: str, input_key: str | None = None,
              label_key: str | None = None, tool_key: str | None = None, max_prompt_len: int | None = None,
              **extra: Any) -> EvalSet:
    prompts, _ = build_samples(
        read_records(path), tokenizer, path=path, input_key=input_key or cfg.eval_input_key,
        label_key=label_key or cfg.eval_label_key or cfg.label_key,
        metadata_key=cfg.metadata_key, apply_chat_template=cfg.apply_chat_template,
        apply_chat_template_kwargs=cfg.apply_chat_template_kwargs, system_prompt=cfg.system_prompt,
        tool_key=tool_key or cfg.eval_tool_key or cfg.tool_key, max_prompt_len=max_prompt_len or cfg.eval_max_prompt_len,
        media=_media_rows(cfg),
    )
    return EvalSet(name, prompts, **extra)


def _media_rows(cfg: EvalConfig) -> Any:
    """The eval sets' media preparer with ``--multimodal-keys`` (the same columns as the training data)."""
    if not cfg.multimodal.enabled:
        return None
    from relax.data.multimodal import MultimodalRows
    from relax.models import resolve_checkpoint

    return MultimodalRows(cfg.multimodal, resolve_checkpoint(cfg.hf_checkpoint).config)


def eval_sampling_params(cfg: EvalConfig, rollout: RolloutConfig) -> dict[str, Any]:
    """The rollout's sampling params, each overridden by its eval flag when that is set."""
    overrides = {"temperature": cfg.eval_temperature, "top_p": cfg.eval_top_p, "top_k": cfg.eval_top_k,
                 "max_new_tokens": cfg.eval_max_response_len, "min_new_tokens": cfg.eval_min_new_tokens}
    return {**rollout.sampling_params(), **{k: v for k, v in overrides.items() if v is not None}}


def capped_to_context(params: dict[str, Any], prompt_len: int, max_context_len: int | None) -> dict[str, Any]:
    """``params`` with ``max_new_tokens`` cut so prompt + response fit ``--eval-max-context-len`` (0 new tokens
    for a prompt that fills it already)."""
    if max_context_len is None:
        return params
    return dict(params, max_new_tokens=max(0, min(params["max_new_tokens"], max_context_len - prompt_len)))


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (Chen et al., 2021)."""
    if n - c < k:
        return 1.0
    return 1.0 - comb(n - c, k) / comb(n, k)


async def _evaluate_set(cfg: EvalConfig, rollout: RolloutConfig, rewards: RewardConfig, step: int, set_index: int,
                        eval_set: EvalSet, data: dict[str, dict[str, list]] | None = None) -> dict[str, float]:
    n = eval_set.n_samples or cfg.n_samples_per_eval_prompt
    samples = [p.copy() for p in eval_set.prompts for _ in range(n)]
    params = {**eval_sampling_params(cfg, rollout), **eval_set.sampling}
    seeds = [sample_seed(rollout.rollout_seed + EVAL_SEED_OFFSET + set_index, step, i) for i in range(len(samples))]
    if rollout.custom_generate_function_path:  # the recipe's own rollout, told it is evaluating (seed 001)
        await custom_generate(rollout, samples, params, seeds, evaluation=True)
    else:
        state = GenerateState(rollout.args, config=rollout)
        requests = [{**prompt_fields(s, rollout.use_slime_router, state.image_pad_id), "return_logprob": True,
                     **media_request_fields(s.multimodal_inputs),
                     "sampling_params": dict(capped_to_context(params, len(s.tokens), cfg.eval_max_context_len),
                                             sampling_seed=seed)} for s, seed in zip(samples, seeds, strict=True)]
        responses = await state.pool.generate_batch(requests, n)
        for s, resp in zip(samples, responses, strict=True):
            take_prompt_ids(s, resp, rollout.use_slime_router)
            apply_response(s, resp)
    await compute_rewards(rewards, samples)
    values = [extract_reward(s.reward, cfg.eval_reward_key) for s in samples]
    if data is not None:  # --custom-eval-rollout-log-function-path's per-set data (relax/core/eval_log_hook.py)
        data[eval_set.name] = {"samples": samples, "rewards": values}
    correct = [sum(r > 0 for r in values[i : i + n]) for i in range(0, len(values), n)]
    prefix = f"eval/{eval_set.name}"
    out = {f"{prefix}/reward_mean": sum(values) / len(values), f"{prefix}/pass@{n}": sum(c > 0 for c in correct) / len(correct),
           f"{prefix}/response_len_mean": sum(s.response_length for s in samples) / len(samples)}
    if cfg.log_passrate:
        k = 1
        while k < n:
            out[f"{prefix}/pass@{k}"] = sum(pass_at_k(n, c, k) for c in correct) / len(correct)
            k *= 2
    return out


def run_eval(cfg: EvalConfig, rollout: RolloutConfig, rewards: RewardConfig, step: int,
             eval_sets: list[EvalSet], data: dict[str, dict[str, list]] | None = None) -> dict[str, float]:
    """The eval metrics; ``data``, when given, receives ``{set name: {"samples", "rewards"}}``."""
    from relax.utils.http_utils import run_closing

    async def all_sets() -> dict[str, float]:
        parts = await gather_or_cancel(*(_evaluate_set(cfg, rollout, rewards, step, i, s, data)
                                       for i, s in enumerate(eval_sets)))
        return {k: v for part in parts for k, v in part.items()}

    return run_closing(all_sets())  # this loop's pooled HTTP session closes with it
