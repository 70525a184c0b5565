"""The typed slice of flags a generative reward model (GenRM) reads: ``--genrm-*`` (relax/engine/rewards/genrm.py).

Built once by the driver with ``GenRMConfig.from_args(args)`` (relax/utils/flag_slice.py). ``validate`` resolves the
two JSON flags into checked values, so the judge and its engines read typed fields, never raw dicts:

``--genrm-sampling-config`` keys (all optional): ``temperature`` (0.1), ``top_p`` (1.0), ``top_k`` (-1),
``max_response_len`` (4096, the judgement's ``max_new_tokens``).

``--genrm-engine-config`` keys (all optional):

* ``max_total_tokens``: the judge engine's context length (prompt + judgement); unset: the model's own;
* ``dp_size``: the number of judge engines; when given it must equal ``--genrm-num-gpus`` /
  ``--genrm-num-gpus-per-engine``; ``pp_size``: 1 only (an embedded engine is one pipeline stage);
* ``prompt_template``: the judge's prompt, a Python format string over ``{prompt}``, ``{response}`` and
  ``{label}`` (default `DEFAULT_TEMPLATE`);
* ``reward_parser``: a dotted path ``parse(judgement: str, sample) -> float | None`` replacing the default parse
  (the last number in the judgement); ``None`` means unparseable;
* ``unparsed_reward``: the reward of a judgement nothing could be parsed from (0.0).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError

DEFAULT_TEMPLATE = ("Rate the response to the question below with a score between 0 and 1, where 1 means fully "
                    "correct. End your answer with the score.\n\nQuestion: {prompt}\n\nResponse: {response}\n\n"
                    "Score:")
SAMPLING_DEFAULTS: dict[str, float | int] = {"temperature": 0.1, "top_p": 1.0, "top_k": -1, "max_response_len": 4096}
ENGINE_KEYS = ("max_total_tokens", "dp_size", "pp_size", "prompt_template", "reward_parser", "unparsed_reward")
REWARD_PARSER_SIGNATURE = "parse(judgement: str, sample: Sample) -> float | None"


@dataclass(frozen=True)
class GenRMConfig(FlagSlice):
    # the judge model; GenRM is on when set
    genrm_model_path: str | None
    # how many judge engines (total / per engine) and the two JSON flags (resolved by validate)
    genrm_num_gpus: int
    genrm_num_gpus_per_engine: int
    genrm_engine_config: Any
    genrm_sampling_config: Any
    # one judge request's bound, retries included (the --rm-type remote_rm rule)
    hook_timeout: float

    @property
    def enabled(self) -> bool:
        return bool(self.genrm_model_path)

    @property
    def num_engines(self) -> int:
        return self.genrm_num_gpus // self.genrm_num_gpus_per_engine

    def sampling_params(self) -> dict[str, Any]:
        """SGLang sampling params of every judge request (``max_response_len`` -> ``max_new_tokens``)."""
        s = {**SAMPLING_DEFAULTS, **(self.genrm_sampling_config or {})}
        return {"temperature": float(s["temperature"]), "top_p": float(s["top_p"]), "top_k": int(s["top_k"]),
                "max_new_tokens": int(s["max_response_len"])}

    def engine(self, key: str) -> Any:
        """A ``--genrm-engine-config`` value, or its default."""
        defaults = {"prompt_template": DEFAULT_TEMPLATE, "unparsed_reward": 0.0}
        return (self.genrm_engine_config or {}).get(key, defaults.get(key))

    def validate(self) -> None:
        if not self.enabled:
            return
        if self.genrm_num_gpus < 1 or self.genrm_num_gpus_per_engine < 1:
            raise ConfigError("--genrm-num-gpus and --genrm-num-gpus-per-engine must be at least 1")
        if self.genrm_num_gpus_per_engine != 1:
            raise ConfigError(f"--genrm-num-gpus-per-engine {self.genrm_num_gpus_per_engine}: the GenRM judge runs "
                              "embedded engines of one GPU each; give the judge more GPUs with --genrm-num-gpus")
        _check_keys("--genrm-sampling-config", self.genrm_sampling_config, tuple(SAMPLING_DEFAULTS))
        _check_keys("--genrm-engine-config", self.genrm_engine_config, ENGINE_KEYS)
        s = self.sampling_params()
        if s["temperature"] < 0 or not 0 < s["top_p"] <= 1 or s["max_new_tokens"] < 1 or s["top_k"] == 0:
            raise ConfigError(f"--genrm-sampling-config: out of range in {s} (temperature >= 0, 0 < top_p <= 1, "
                              "top_k -1 or >= 1, max_response_len >= 1)")
        dp, pp = self.engine("dp_size"), self.engine("pp_size")
        if dp is not None and dp != self.num_engines:
            raise ConfigError(f"--genrm-engine-config dp_size {dp} differs from --genrm-num-gpus / "
                              f"--genrm-num-gpus-per-engine = {self.num_engines} judge engines")
        if pp not in (None, 1):
            raise ConfigError(f"--genrm-engine-config pp_size {pp}: only 1 (an embedded judge engine is one stage)")
        template = self.engine("prompt_template")
        try:
            template.format(prompt="", response="", label="")
        except (AttributeError, KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"--genrm-engine-config prompt_template: not a format string over {{prompt}}, "
                              f"{{response}}, {{label}} ({type(exc).__name__}: {exc})") from None
        unparsed = self.engine("unparsed_reward")
        if not isinstance(unparsed, int | float) or not math.isfinite(unparsed):
            raise ConfigError(f"--genrm-engine-config unparsed_reward must be a finite number, got {unparsed!r}")


def _check_keys(flag: str, value: Any, known: tuple[str, ...]) -> None:
    if value is None:
        return
    if not isinstance(value, dict):
        raise ConfigError(f"{flag} must be a JSON object, got {value!r}")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ConfigError(f"{flag}: unknown key(s) {', '.join(unknown)}; known: {', '.join(known)}")
