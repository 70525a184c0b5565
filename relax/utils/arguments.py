"""Parsing and validating ``relax train`` flags (the table lives in flag_table.py).

Every default is resolved here, once: downstream code reads ``args.<dest>`` and trusts it.
Problems raise `ConfigError` with a one-line message; the CLI prints it as ``relax: ...``
and exits 2.
"""

from __future__ import annotations

import argparse
import difflib
import json
import re
import time
from pathlib import Path
from typing import Any

from relax.utils.flag_table import FLAGS, FLAGS_BY_NAME, FlagSpec

SGLANG_PREFIX = "sglang-"


class ConfigError(ValueError):
    """A flag, preset or config file is wrong; the message is one line."""


# ---------------------------------------------------------------------- value types
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}


def parse_size(text: str | int) -> int:
    """``512MB`` / ``1GB`` / ``1048576`` -> bytes (binary multiples, as the seed's ``1GB (1024³)``)."""
    if isinstance(text, int):
        return text
    m = _SIZE.match(str(text))
    if not m:
        raise ValueError(f"not a size: {text!r} (examples: 1048576, 512MB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


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
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON: {exc.msg}") from None


_SCALAR = {"int": int, "float": float, "str": str, "bool": parse_bool, "json": parse_json, "size": parse_size,
           "str_list": str, "int_list": int}


def convert(spec: FlagSpec, value: Any) -> Any:
    """Type a value coming from a preset or config file like the command line would."""
    if value is None:
        return None
    if spec.type == "flag":
        return parse_bool(value)
    if spec.type in ("str_list", "int_list"):
        items = value if isinstance(value, list) else [value]
        return [_SCALAR[spec.type](v) for v in items]
    if spec.type == "int" and isinstance(value, float) and not value.is_integer():
        raise ValueError(f"not an integer: {value!r}")
    return _SCALAR[spec.type](value)


# ---------------------------------------------------------------------- parser
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit
        raise ConfigError(message)


def _typed(spec: FlagSpec):
    def fn(text: str) -> Any:
        try:
            return convert(spec, text) if spec.type not in ("str_list", "int_list") else _SCALAR[spec.type](text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    fn.__name__ = spec.type
    return fn


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="relax train", description="Train an LLM policy with RL. Flags: docs/flags.md",
                     argument_default=argparse.SUPPRESS, allow_abbrev=False)
    groups: dict[str, Any] = {}
    for spec in FLAGS:
        group = groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        kwargs: dict[str, Any] = {"dest": spec.dest, "help": spec.help}
        if spec.type == "flag":
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _typed(spec)
            if spec.type in ("str_list", "int_list"):
                kwargs["nargs"] = "+"
            if spec.choices:
                kwargs["choices"] = list(spec.choices)
        group.add_argument(f"--{spec.name}", **kwargs)
    return parser


def _collect_passthrough(extra: list[str]) -> dict[str, Any]:
    """``--sglang-foo-bar V`` / ``--sglang-foo-bar`` -> ``{"foo_bar": V | True}``; anything else is an error."""
    out: dict[str, Any] = {}
    i = 0
    while i < len(extra):
        token = extra[i]
        if not token.startswith("--"):
            raise ConfigError(f"unexpected argument {token!r}")
        name = token[2:].split("=", 1)[0]
        if not name.startswith(SGLANG_PREFIX):
            close = difflib.get_close_matches(name, FLAGS_BY_NAME, n=1)
            hint = f" (did you mean --{close[0]}?)" if close else ""
            raise ConfigError(f"unknown flag --{name}{hint}")
        key = name[len(SGLANG_PREFIX):].replace("-", "_")
        if "=" in token:
            out[key] = token.split("=", 1)[1]
        elif i + 1 < len(extra) and not extra[i + 1].startswith("--"):
            out[key] = extra[i + 1]
            i += 1
        else:
            out[key] = True
        i += 1
    return out


def _load_config_file(path: str, flag: str) -> dict[str, Any]:
    import yaml

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"{flag}: config file not found: {p}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{flag}: {p}: invalid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{flag}: {p}: expected a mapping of flag names to values")
    out = {}
    for key, value in data.items():
        spec = FLAGS_BY_NAME.get(str(key).replace("_", "-"))
        if spec is None or spec.name in ("config", "custom-config-path"):
            raise ConfigError(f"{flag}: {p}: unknown key {key!r}")
        try:
            out[spec.dest] = convert(spec, value)
        except ValueError as exc:
            raise ConfigError(f"{flag}: {p}: key {key!r}: {exc}") from None
        if spec.choices and out[spec.dest] not in spec.choices:
            raise ConfigError(f"{flag}: {p}: key {key!r}: {value!r} is not one of {', '.join(spec.choices)}")
    return out


# ---------------------------------------------------------------------- main entry
def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = build_parser()
    explicit_ns, extra = parser.parse_known_args(argv)
    explicit = vars(explicit_ns)
    passthrough = _collect_passthrough(extra)

    values: dict[str, Any] = {spec.dest: spec.default for spec in FLAGS}
    if explicit.get("preset"):
        from relax.utils.presets import get_preset

        values.update(get_preset(explicit["preset"]))
    for flag in ("config", "custom_config_path"):
        if explicit.get(flag):
            values.update(_load_config_file(explicit[flag], "--" + flag.replace("_", "-")))
    values.update(explicit)
    args = argparse.Namespace(**values)
    args.sglang_passthrough = passthrough
    _check_supported(args)
    from relax.utils.validation import resolve_and_validate

    resolve_and_validate(args)
    if args.output_dir is None:
        args.output_dir = f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def _check_supported(args: argparse.Namespace) -> None:
    """Refuse, in table order, the first flag whose feature does not exist yet."""
    for spec in FLAGS:
        value = getattr(args, spec.dest)
        if spec.supported_values is not None and value not in spec.supported_values and value is not None:
            raise ConfigError(f"not supported yet: --{spec.name} {value}")
        if not spec.supported and value != spec.default:
            raise ConfigError(f"not supported yet: --{spec.name}")
    if args.sglang_passthrough and args.rollout_backend != "sglang":
        first = next(iter(args.sglang_passthrough))
        raise ConfigError(f"not supported yet: --sglang-{first.replace('_', '-')}")


def args_to_dict(args: argparse.Namespace) -> dict[str, Any]:
    """A JSON-serializable copy of every parsed value (for run.json)."""
    return json.loads(json.dumps(vars(args), default=str))
