"""Value types of the flag table and the one error every flag problem raises.

The same converters type a value whether it comes from the command line (a string), a
``--config`` YAML file or a preset (already a Python value), so all three sources agree.
"""

from __future__ import annotations

import json
import re
from typing import Any

MiB = 1024**2
GiB = 1024**3

# The type names a FlagSpec may carry (seed wording in parentheses).
FLAG_TYPES = ("int", "float", "str", "flag", "bool", "json", "str_list", "int_list", "size")


class ConfigError(ValueError):
    """A flag, preset or config file is wrong. The message is always one line."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": MiB, "G": GiB, "T": 1024**4}


def parse_size(text: str | int) -> int:
    """``512MB`` / ``256MiB`` / ``1GB`` / ``1048576`` -> bytes (binary multiples, like the seed's ``1GB (1024³)``)."""
    if isinstance(text, bool):
        raise ValueError(f"not a size: {text!r}")
    if isinstance(text, int):
        if text < 0:
            raise ValueError(f"size must be >= 0, got {text}")
        return text
    m = _SIZE.match(str(text))
    if not m or (m.group(3) and not m.group(2) and m.group(3).lower() == "ib"):
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 512MB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


def format_size(n: int) -> str:
    """The shortest exact spelling of a byte count that `parse_size` reads back."""
    for unit in ("T", "G", "M", "K"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}B"
    return str(n)


def parse_bool(text: str | bool) -> bool:
    if isinstance(text, bool):
        return text
    value = str(text).strip().lower()
    if value in ("true", "1", "yes", "on"):
        return True
    if value in ("false", "0", "no", "off"):
        return False
    raise ValueError(f"not a boolean: {text!r} (use true or false)")


def parse_json(text: Any) -> Any:
    if not isinstance(text, str):
        return text  # already structured (YAML or preset)
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg} at position {exc.pos}") from None


def parse_int(text: Any) -> int:
    if isinstance(text, bool):
        raise ValueError(f"expected an integer, got {text!r}")
    if isinstance(text, int):
        return text
    if isinstance(text, float):
        if not text.is_integer():
            raise ValueError(f"expected an integer, got {text!r}")
        return int(text)
    try:
        return int(str(text).strip())
    except ValueError:
        raise ValueError(f"expected an integer, got {text!r}") from None


def parse_float(text: Any) -> float:
    if isinstance(text, bool):
        raise ValueError(f"expected a number, got {text!r}")
    try:
        return float(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {text!r}") from None


def parse_str(text: Any) -> str:
    if isinstance(text, (dict, list)):
        raise ValueError(f"expected a string, got {type(text).__name__}")
    return str(text)


SCALAR_PARSERS = {
    "int": parse_int, "float": parse_float, "str": parse_str, "bool": parse_bool, "flag": parse_bool,
    "json": parse_json, "size": parse_size, "str_list": parse_str, "int_list": parse_int,
}


def convert(type_: str, value: Any) -> Any:
    """Type one value (a CLI string or a YAML/preset value) as a flag of type ``type_``."""
    if value is None:
        return None
    if type_ in ("str_list", "int_list"):
        items = value if isinstance(value, (list, tuple)) else [value]
        return [SCALAR_PARSERS[type_](v) for v in items]
    return SCALAR_PARSERS[type_](value)
