"""Generative reward model (GenRM, ``--genrm-model-path``): a judge model scores each response by writing a judgement.

The run starts the judge's own engines (relax/core/genrm_engines.py: embedded engines over ``--genrm-model-path``,
``--genrm-num-gpus`` of them, never synced with the policy) and registers their URLs here (`set_judges`). For each
sample the judge gets SGLang's text request ``{"text": prompt_template.format(prompt=, response=, label=),
"sampling_params": --genrm-sampling-config}`` at ``/generate`` of one judge engine (round robin over the batch);
the reward is parsed from the answer's ``text``:

* default: the **last number** in the judgement (``-1``, ``0.75``, ``1e-3``; `parse_last_number`);
* ``reward_parser`` in ``--genrm-engine-config``: a dotted path ``parse(judgement, sample) -> float | None``.

A judgement with no number (or a parser returning ``None`` or a non-finite value) gets ``unparsed_reward`` (0.0 by
default) and counts in the ``rollout/genrm_unparsed_frac`` metric. Each sample keeps its judgement in
``metadata["genrm_judgement"]`` (and ``metadata["genrm_parsed"]``), so samples.jsonl shows what the judge said.

Requests are those of ``--rm-type remote_rm`` (`relax.engine.rewards.remote.post_for_sample`): every sample of a
step concurrently (the engine batches them), retries of connection errors and 5xx, at most ``--hook-timeout`` seconds
per sample, retries included. A judge engine that stays down ends the run in one `GenRMError` line naming it
(``genrm:<i>`` and its URL).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

from relax.engine.rewards.genrm_config import REWARD_PARSER_SIGNATURE, GenRMConfig
from relax.utils.gather import gather_or_cancel
from relax.utils.plugins import load_function
from relax.utils.types import Sample

NUMBER = re.compile(r"[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?")
UNPARSED_METRIC = "rollout/genrm_unparsed_frac"


class GenRMError(RuntimeError):
    """A GenRM judge engine could not score a sample (down, unreachable, or a malformed answer)."""


_JUDGES: list[str] = []  # the running judge engines' URLs, index i is genrm:<i> (set by relax/core/genrm_engines.py)
_HEADERS: dict[str, str] = {}  # the run's engine API key, when its engines serve off loopback


def set_judges(urls: list[str], api_key: str | None = None) -> None:
    _JUDGES[:] = list(urls)
    _HEADERS.clear()
    if api_key:
        _HEADERS["Authorization"] = f"Bearer {api_key}"


def judges() -> list[str]:
    if not _JUDGES:
        raise GenRMError("--genrm-model-path: no GenRM judge engine is running (relax/core/genrm_engines.py "
                         "start_genrm was not called)")
    return list(_JUDGES)


def parse_last_number(judgement: str, sample: Sample | None = None) -> float | None:
    """The default parse: the last number in ``judgement`` (None when there is none)."""
    found = NUMBER.findall(judgement or "")
    return float(found[-1]) if found else None


def judge_request(cfg: GenRMConfig, sample: Sample) -> dict[str, Any]:
    """The judge's SGLang text request for ``sample``."""
    prompt = sample.prompt if isinstance(sample.prompt, str) else json.dumps(sample.prompt, ensure_ascii=False)
    text = cfg.engine("prompt_template").format(prompt=prompt, response=sample.response or "",
                                                label="" if sample.label is None else sample.label)
    return {"text": text, "sampling_params": cfg.sampling_params()}


def genrm_scorer(cfg: GenRMConfig):
    """The `relax.engine.rewards.Scorer` of the judge: one float per sample."""
    from relax.engine.rewards.remote import post_for_sample
    from relax.utils.http_utils import EngineError

    path = cfg.engine("reward_parser")
    parse = (load_function(path, flag="--genrm-engine-config reward_parser", signature=REWARD_PARSER_SIGNATURE,
                           min_args=2) if path else parse_last_number)
    unparsed = float(cfg.engine("unparsed_reward"))

    async def judge(url: str, name: str, sample: Sample) -> float:
        try:
            answer = await post_for_sample(f"{url}/generate", judge_request(cfg, sample), sample, cfg.hook_timeout,
                                           name=f"GenRM judge engine {name} ({url})",
                                           headers=dict(_HEADERS) or None)
        except EngineError as exc:
            raise GenRMError(str(exc)) from None
        if not isinstance(answer, dict) or not isinstance(answer.get("text"), str):
            raise GenRMError(f"GenRM judge engine {name} ({url}): no text in its answer for sample index "
                             f"{sample.index}: {str(answer)[:200]}")
        text = answer["text"]
        try:
            value = parse(text, sample)
        except Exception as exc:
            exc.add_note(f"in --genrm-engine-config reward_parser {path} (sample index {sample.index})")
            raise
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        sample.metadata = {**(sample.metadata or {}), "genrm_judgement": text, "genrm_parsed": ok}
        return float(value) if ok else unparsed

    async def score(samples: list[Sample]) -> list[float]:
        urls = judges()
        return list(await gather_or_cancel(*(judge(urls[i % len(urls)], f"genrm:{i % len(urls)}", s)
                                           for i, s in enumerate(samples))))

    return score


def genrm_metrics(samples: list[Sample]) -> dict[str, float]:
    """``rollout/genrm_unparsed_frac``: the share of judgements no reward could be parsed from."""
    flags = [bool((s.metadata or {}).get("genrm_parsed")) for s in samples]
    return {UNPARSED_METRIC: (flags.count(False) / len(flags)) if flags else 0.0}
