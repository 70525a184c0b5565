"""Extra per-step rollout metrics the logging flags ask for, computed from the step's trained samples:

- ``--log-correct-samples``: the samples whose reward is 1 (slime's rule): ``rollout/correct_samples`` (count),
  ``rollout/correct_response_len_mean``, ``rollout/correct_entropy`` (minus the mean rollout log-prob of their
  response tokens) and ``correct_length/p25|p50|p75|p100``, the share of correct responses whose length falls
  in each quarter of ``--rollout-max-response-len``.
- ``--log-multi-turn``: ``raw_response_length/response_length_{mean,max,min,clip_ratio}`` (every response token,
  observations included), ``wo_obs_response_length/response_length_{mean,max,min}`` (the model's tokens: the loss
  mask) and ``multi_turn_metric/round_number_{mean,max,min}`` (``metadata["turns"]`` of the multi-turn rollout).
- ``--log-reward-category KEY``: for a dict reward, the samples grouped by ``reward[KEY]``:
  ``reward_category/<value>/frac`` and ``reward_category/<value>/reward_mean``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from relax.metrics.sample_records import scalar_reward
from relax.utils.flag_slice import FlagSlice
from relax.utils.types import Sample


@dataclass(frozen=True)
class RolloutLogConfig(FlagSlice):
    log_correct_samples: bool
    log_multi_turn: bool
    log_reward_category: str | None
    rollout_max_response_len: int | None
    reward_key: str | None

    @property
    def any(self) -> bool:
        return self.log_correct_samples or self.log_multi_turn or bool(self.log_reward_category)


def rollout_log_metrics(cfg: RolloutLogConfig, samples: list[Sample]) -> dict[str, float]:
    out: dict[str, float] = {}
    if cfg.log_correct_samples:
        out.update(_correct(cfg, samples))
    if cfg.log_multi_turn:
        out.update(_multi_turn(cfg, samples))
    if cfg.log_reward_category:
        out.update(_categories(cfg, samples))
    return out


def _correct(cfg: RolloutLogConfig, samples: list[Sample]) -> dict[str, float]:
    correct = [s for s in samples if scalar_reward(s.reward, cfg.reward_key) == 1]
    out = {"rollout/correct_samples": float(len(correct))}
    if not correct:
        return out
    lengths = [s.response_length for s in correct]
    out["rollout/correct_response_len_mean"] = float(np.mean(lengths))
    logps = [lp for s in correct for lp in (s.rollout_log_probs or [])]
    if logps:
        out["rollout/correct_entropy"] = float(-np.mean(logps))
    limit = cfg.rollout_max_response_len or max(lengths)
    cuts = [limit * (i + 1) / 4 for i in range(4)]
    counts = [0] * 4
    for n in lengths:
        counts[next((i for i, c in enumerate(cuts) if n <= c), 3)] += 1
    for i, count in enumerate(counts):
        out[f"correct_length/p{math.ceil((i + 1) * 25)}"] = count / len(lengths)
    return out


def _multi_turn(cfg: RolloutLogConfig, samples: list[Sample]) -> dict[str, float]:
    raw = np.array([s.response_length for s in samples], dtype=np.float64)
    model = np.array([sum(s.loss_mask) if s.loss_mask is not None else s.response_length for s in samples],
                     dtype=np.float64)
    out = {"raw_response_length/response_length_mean": float(raw.mean()),
           "raw_response_length/response_length_max": float(raw.max()),
           "raw_response_length/response_length_min": float(raw.min()),
           "wo_obs_response_length/response_length_mean": float(model.mean()),
           "wo_obs_response_length/response_length_max": float(model.max()),
           "wo_obs_response_length/response_length_min": float(model.min())}
    if cfg.rollout_max_response_len:
        out["raw_response_length/response_length_clip_ratio"] = float((raw >= cfg.rollout_max_response_len).mean())
    rounds = np.array([len(s.metadata.get("turns") or []) or 1 for s in samples], dtype=np.float64)
    out.update({"multi_turn_metric/round_number_mean": float(rounds.mean()),
                "multi_turn_metric/round_number_max": float(rounds.max()),
                "multi_turn_metric/round_number_min": float(rounds.min())})
    return out


def _categories(cfg: RolloutLogConfig, samples: list[Sample]) -> dict[str, float]:
    groups: dict[str, list[float]] = {}
    for s in samples:
        if isinstance(s.reward, dict) and cfg.log_reward_category in s.reward:
            value = scalar_reward(s.reward, cfg.reward_key)
            groups.setdefault(str(s.reward[cfg.log_reward_category]), []).append(
                float("nan") if value is None else float(value))
    out: dict[str, Any] = {}
    for category, rewards in sorted(groups.items()):
        out[f"reward_category/{category}/frac"] = len(rewards) / len(samples)
        out[f"reward_category/{category}/reward_mean"] = float(np.nanmean(rewards)) if rewards else float("nan")
    return out
