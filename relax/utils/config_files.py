"""``--config`` / ``--custom-config-path`` YAML files: flag names as keys, values typed like the CLI.

A file is one mapping. Keys are flag names spelled with ``-`` or ``_`` (``rollout_batch_size``
or ``rollout-batch-size``); values are typed by the flag table exactly as the command line
would type them (``update_weight_buffer_size: 256MB`` works, so does a YAML list for a list
flag). Undeclared ``sglang-*`` keys go to the SGLang passthrough like ``--sglang-*`` flags.

``--config`` takes flag names only: any other key is an error naming the file and the key.
``--custom-config-path`` is also where Relax recipes keep their own settings (seed 004:
``max_turns``, ``rollout_interaction_env_path``, a judge URL): a key that is not a flag is set
on ``args`` under its own name, as it is (``args.max_turns``), for the recipe to read; a key that
names a flag is that flag, typed and validated like it. Every bad key of a file is reported.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError, Problems, convert

SGLANG_PREFIX = "sglang-"
# Keys a config file may not set: they choose config files themselves.
_NOT_IN_FILES = ("config", "custom-config-path")
# attributes relax puts on args besides the flags: a recipe key may not shadow them
RESERVED_ATTRIBUTES = ("sglang_passthrough", "notices", "sglang_router_ip", "sglang_router_port")
# str flags whose value may be a list (seed 004: --prompt-data "['a.parquet', 'b.parquet']"): a YAML list
# is kept as its JSON text, which the flag's reader parses (relax.data.dataset.prompt_files)
_LIST_LITERAL_FLAGS = ("prompt-data",)


@dataclass
class LoadedConfig:
    values: dict[str, Any] = field(default_factory=dict)  # by flag dest
    passthrough: dict[str, Any] = field(default_factory=dict)  # undeclared sglang-* keys
    extra: dict[str, Any] = field(default_factory=dict)  # --custom-config-path keys that are not flags


def recipe_keys_notice(flag: str, keys: list[str]) -> str:
    """The start-up line naming the keys set on ``args`` as recipe settings: a misspelled flag lands there too,
    so each key that is close to a flag's name says which one."""
    named = []
    for key in keys:
        close = difflib.get_close_matches(key.replace("_", "-"), list(FLAGS_BY_NAME), n=1, cutoff=0.85)
        named.append(f"{key} (is it --{close[0]}?)" if close else key)
    return f"{flag}: keys that are no flag, set on args as recipe settings: {', '.join(named)}"


def _read_mapping(p: Path, flag: str) -> dict:
    import yaml

    if not p.is_file():
        raise ConfigError(f"{flag}: config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag}: {p}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: {p}: expected a mapping of flag names to values, got {type(data).__name__}")
    return data


def load_config_file(path: str, flag: str, problems: Problems | None = None, *,
                     allow_extra: bool = False) -> LoadedConfig:
    """Read one file given to ``flag``. Problems go to ``problems`` (all of them), else the first is raised."""
    p = Path(path)
    own = problems is None
    problems = Problems() if own else problems
    data = problems.run(_read_mapping, p, flag) or {}
    out = LoadedConfig()
    for key, value in data.items():
        name = str(key).replace("_", "-")
        spec = FLAGS_BY_NAME.get(name)
        if spec is None and name.startswith(SGLANG_PREFIX):
            out.passthrough[name[len(SGLANG_PREFIX):].replace("-", "_")] = True if value is None else value
        elif spec is None and allow_extra and str(key) in RESERVED_ATTRIBUTES:
            problems.add(f"{flag}: {p}: key {key!r} names an attribute relax sets itself; rename it")
        elif spec is None and allow_extra and name not in _NOT_IN_FILES and str(key).isidentifier():
            out.extra[str(key)] = value
        elif spec is None or name in _NOT_IN_FILES:
            problems.add(f"{flag}: {p}: unknown key {key!r}")
        else:
            if name in _LIST_LITERAL_FLAGS and isinstance(value, list):
                value = json.dumps(value)
            try:
                out.values[spec.dest] = typed_value(spec, value, where=f"{flag}: {p}: key {key!r}")
            except ConfigError as exc:
                problems.add(str(exc))
    if own:
        problems.raise_if_any()
    return out


def typed_value(spec, value: Any, where: str) -> Any:
    """Type a value from a file or preset like the command line would, or raise ConfigError naming ``where``."""
    if value is None and spec.default is not None:
        raise ConfigError(f"{where}: null is not a value of this flag (its default is {spec.default!r})")
    try:
        out = convert(spec.type, value)
    except ValueError as exc:
        raise ConfigError(f"{where}: {exc}") from None
    if spec.choices and out is not None:
        items = out if isinstance(out, list) else [out]
        bad = [v for v in items if v not in spec.choices]
        if bad:
            raise ConfigError(f"{where}: {bad[0]!r} is not one of {', '.join(spec.choices)}")
    return out
