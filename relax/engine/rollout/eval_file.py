"""``--eval-config FILE``: the eval sets as a file (seed 000; a small subset of slime's eval config), in place
of ``--eval-prompt-data``.

YAML or JSON (a ``.json`` file is read as JSON, anything else as YAML, which JSON also is)::

    eval:
      defaults:                       # optional; every key is optional and applies to each dataset
        n_samples_per_eval_prompt: 4
        temperature: 0.6
      datasets:                       # at least one
        - name: aime                  # the metrics' eval/<name>/... prefix (unique)
          path: data/aime.jsonl       # a prompt file (as --eval-prompt-data's PATH)
          input_key: question         # then as in defaults:
          label_key: answer
          max_response_len: 1024

A dataset's keys and the defaults' are ``input_key``, ``label_key``, ``tool_key`` (the records' fields),
``max_prompt_len``, ``n_samples_per_eval_prompt``, ``temperature``, ``top_p``, ``top_k``, ``max_response_len``
and ``min_new_tokens``. A key left out falls back to the defaults, then to its ``--eval-*`` flag, then to the
rollout's. An unknown key, a wrong type, a missing file or a file that is not YAML is a `ConfigError` with one
line per problem, naming the file and the key (``eval.datasets[0].temperature``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relax.utils.field_paths import field_path
from relax.utils.flag_types import ConfigError, ConfigErrors

FLAG = "--eval-config"


class EvalOverrides(BaseModel):
    """What a dataset (or the defaults) may set; None falls back."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    input_key: str | None = None
    label_key: str | None = None
    tool_key: str | None = None
    max_prompt_len: int | None = Field(default=None, ge=1)
    n_samples_per_eval_prompt: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0)
    top_p: float | None = Field(default=None, gt=0, le=1)
    top_k: int | None = None
    max_response_len: int | None = Field(default=None, ge=0)
    min_new_tokens: int | None = Field(default=None, ge=0)

    def merged_over(self, defaults: EvalOverrides) -> EvalOverrides:
        """These keys over ``defaults`` (as plain overrides: a dataset's name and path are left out)."""
        mine = self.model_dump(exclude_none=True, exclude={"name", "path"})
        return EvalOverrides(**{**defaults.model_dump(exclude_none=True), **mine})

    def sampling(self) -> dict[str, Any]:
        """The SGLang sampling params this sets."""
        named = {"temperature": self.temperature, "top_p": self.top_p, "top_k": self.top_k,
                 "max_new_tokens": self.max_response_len, "min_new_tokens": self.min_new_tokens}
        return {k: v for k, v in named.items() if v is not None}


class EvalDataset(EvalOverrides):
    name: str = Field(min_length=1)
    path: str = Field(min_length=1)


class EvalSection(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    defaults: EvalOverrides = EvalOverrides()
    datasets: list[EvalDataset] = Field(min_length=1)

    @model_validator(mode="after")
    def _unique_names(self) -> EvalSection:
        names = [d.name for d in self.datasets]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"dataset names must be unique: {', '.join(dupes)}")
        return self


class EvalFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    eval: EvalSection



def load_eval_file(path: str) -> list[EvalDataset]:
    """The datasets of ``--eval-config``, each merged over the defaults."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{FLAG} {path}: cannot read ({exc.strerror or exc})") from None
    try:
        if p.suffix == ".json":
            raw = json.loads(text)
        else:
            import yaml

            raw = yaml.safe_load(text)
    except (ValueError, Exception) as exc:  # json.JSONDecodeError, yaml.YAMLError
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{FLAG} {path}: not {'JSON' if p.suffix == '.json' else 'YAML'}: {first}") from None
    try:
        parsed = EvalFile.model_validate(raw)
    except ValidationError as exc:
        lines = [f"{FLAG} {path}: {field_path(e['loc'])}: {e['msg']}" for e in exc.errors()]
        raise (ConfigError(lines[0]) if len(lines) == 1 else ConfigErrors(lines)) from None
    section = parsed.eval
    return [EvalDataset(name=d.name, path=d.path, **d.merged_over(section.defaults).model_dump(exclude_none=True))
            for d in section.datasets]
