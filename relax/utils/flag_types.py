"""Value types of the flag table and the one error every flag problem raises.

The same converters type a value whether it comes from the command line (a string), a
``--config`` YAML file or a preset (already a Python value), so all three sources agree.
"""

from __future__ import annotations

import json
import math
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

    @property
    def problems(self) -> list[str]:
        return [str(self)]


class ConfigErrors(ConfigError):
    """Several problems found in one pass (all unknown flags, every broken rule): one line each."""

    def __init__(self, problems: list[str]) -> None:
        lines = [" ".join(str(p).split()) for p in problems]
        ValueError.__init__(self, "\n".join(lines))
        self._problems = lines

    @property
    def problems(self) -> list[str]:
        return list(self._problems)


class Problems:
    """A collector of one-line problems, so a parse reports every problem at once instead of the first.

    Rules call `add`; code that raises `ConfigError` (or a subclass of ``catch``) runs through `run`,
    which records the error and carries on. `raise_if_any` raises one `ConfigError` (a single problem)
    or `ConfigErrors` (several), in the order they were found, duplicates dropped.
    """

    def __init__(self) -> None:
        self.lines: list[str] = []

    def add(self, message: str) -> None:
        line = " ".join(str(message).split())
        if line not in self.lines:
            self.lines.append(line)

    def run(self, fn, *args: Any, catch: tuple[type[BaseException], ...] = (), **kwargs: Any) -> Any:
        """Call ``fn``; a ConfigError (or one of ``catch``) it raises becomes problems. Returns fn's result or None.

        Any other exception is a consequence of an earlier problem when there is one (a rule reading a
        value an earlier rule already refused) and is dropped then; otherwise it is a bug and propagates.
        """
        try:
            return fn(*args, **kwargs)
        except ConfigError as exc:
            for line in exc.problems:
                self.add(line)
        except catch as exc:
            self.add(str(exc))
        except Exception:
            if not self.lines:
                raise
        return None

    def __bool__(self) -> bool:
        return bool(self.lines)

    def error(self) -> ConfigError:
        return ConfigError(self.lines[0]) if len(self.lines) == 1 else ConfigErrors(self.lines)

    def raise_if_any(self) -> None:
        if self.lines:
            raise self.error()


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
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"expected a number, got {text!r}") from None
    if math.isnan(value):  # passes every range check (each comparison is False): refused by name here
        raise ValueError(f"expected a number, got {text!r} (not a number)")
    return value


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
