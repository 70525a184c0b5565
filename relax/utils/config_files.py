"""``--config`` / ``--custom-config-path`` YAML files: flag names as keys, values typed like the CLI.

A file is one mapping. Keys are flag names spelled with ``-`` or ``_`` (``rollout_batch_size``
or ``rollout-batch-size``); values are typed by the flag table exactly as the command line
would type them (``update_weight_buffer_size: 256MB`` works, so does a YAML list for a list
flag). Undeclared ``sglang-*`` keys go to the SGLang passthrough like ``--sglang-*`` flags.
Any other unknown key is an error naming the file and the key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from relax.utils.flag_table import FLAGS_BY_NAME
from relax.utils.flag_types import ConfigError, convert

SGLANG_PREFIX = "sglang-"
# Keys a config file may not set: they choose config files themselves.
_NOT_IN_FILES = ("config", "custom-config-path")


def load_config_file(path: str, flag: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Read one file given to ``flag``; return (values by dest, sglang passthrough)."""
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{flag}: config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag}: {p}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if data is None:
        return {}, {}
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: {p}: expected a mapping of flag names to values, got {type(data).__name__}")
    values: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    for key, value in data.items():
        name = str(key).replace("_", "-")
        spec = FLAGS_BY_NAME.get(name)
        if spec is None and name.startswith(SGLANG_PREFIX):
            passthrough[name[len(SGLANG_PREFIX):].replace("-", "_")] = True if value is None else value
            continue
        if spec is None or name in _NOT_IN_FILES:
            raise ConfigError(f"{flag}: {p}: unknown key {key!r}")
        values[spec.dest] = typed_value(spec, value, where=f"{flag}: {p}: key {key!r}")
    return values, passthrough


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
