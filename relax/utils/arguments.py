"""Parsing ``relax train`` flags: command line, presets, config files, passthrough, the gate.

The table of flags lives in flag_table.py; this module turns an argv into a Namespace whose
attributes are the flag dests (``args.rollout_batch_size``), every default resolved.
Order of layers: documented defaults < ``--preset`` < ``--config`` / ``--custom-config-path``
files < explicit command-line flags (position on the command line does not matter).
Every problem raises `ConfigError` with a one-line message; the CLI prints it as
``relax: <message>`` and exits 2.

Extra attributes beyond the table: ``sglang_passthrough`` (undeclared ``--sglang-foo-bar V``
flags as ``{"foo_bar": "V"}``; a bare flag gives True).
"""

from __future__ import annotations

import argparse
import copy
import difflib
import json
import time
from typing import Any

from relax.utils.config_files import SGLANG_PREFIX, load_config_file, recipe_keys_notice, typed_value
from relax.utils.flag_table import FLAGS, FLAGS_BY_NAME, FlagSpec
from relax.utils.flag_types import ConfigError, Problems, convert, parse_size
from relax.utils.machine_flags import check_machine
from relax.utils.presets import get_preset
from relax.utils.validation import resolve_and_validate

__all__ = ["FLAGS", "ConfigError", "args_to_dict", "build_parser", "check_supported", "format_flag", "parse_args",
           "parse_size"]


def format_flag(name: str) -> str:
    """``rollout_batch_size`` or ``rollout-batch-size`` -> ``--rollout-batch-size`` (for messages)."""
    return "--" + name.lstrip("-").replace("_", "-")


# ---------------------------------------------------------------------- command line
class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse would print usage and exit
        raise ConfigError(message)


def _typed(spec: FlagSpec):
    """argparse ``type=``: one command-line token typed like the table says."""
    item_type = spec.type

    def fn(text: str) -> Any:
        try:
            value = convert(item_type, text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value[0] if spec.type in ("str_list", "int_list") else value

    fn.__name__ = spec.type
    return fn


def _help(spec: FlagSpec) -> str:
    default = "required" if spec.required else repr(spec.default)
    status = "" if spec.supported else " (not supported yet)"
    return f"{spec.help} [default: {default}]{status}"


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser for every flag in the table; absent flags stay absent (no defaults here)."""
    parser = _Parser(prog="relax train", usage="relax train [--preset NAME] [--config FILE.yaml] [--FLAG VALUE ...]",
                     description="Train an LLM policy with RL. Reference: docs/flags.md",
                     argument_default=argparse.SUPPRESS, allow_abbrev=False)
    groups: dict[str, Any] = {}
    for spec in FLAGS:
        group = groups.setdefault(spec.group, parser.add_argument_group(spec.group))
        kwargs: dict[str, Any] = {"dest": spec.dest, "help": _help(spec).replace("%", "%%")}
        if spec.type == "flag":
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _typed(spec)
            if spec.type in ("str_list", "int_list"):
                kwargs["nargs"] = "+"
            elif spec.type == "bool":  # --polling-mode false; a bare --polling-mode means true
                kwargs.update(nargs="?", const=True, metavar="true|false")
            if spec.choices:
                kwargs["choices"] = list(spec.choices)
        group.add_argument(f"--{spec.name}", **kwargs)
    return parser


def _split_passthrough(argv: list[str]) -> tuple[list[str], dict[str, Any]]:
    """Take undeclared ``--sglang-foo-bar [V ...]`` / ``--sglang-foo-bar=V`` out of argv (several values: a list,
    which server_args.py accepts only for SGLang's list options)."""
    rest: list[str] = []
    out: dict[str, Any] = {}
    i = 0
    while i < len(argv):
        token = argv[i]
        name = token[2:].split("=", 1)[0] if token.startswith("--") else ""
        if not name.startswith(SGLANG_PREFIX) or name in FLAGS_BY_NAME:
            rest.append(token)
            i += 1
            continue
        key = name[len(SGLANG_PREFIX):].replace("-", "_")
        if not key:
            raise ConfigError(f"incomplete flag {token!r}")
        if "=" in token:
            out[key] = token.split("=", 1)[1]
        else:  # every value up to the next flag: SGLang has list options (--cuda-graph-bs 1 2 4)
            values = []
            while i + 1 < len(argv) and not argv[i + 1].startswith("--"):
                values.append(argv[i + 1])
                i += 1
            out[key] = True if not values else values[0] if len(values) == 1 else values
        i += 1
    return rest, out


def _unknown(token: str) -> str:
    """The problem line for an argument argparse did not take."""
    if not token.startswith("--"):
        return f"unexpected argument {token!r} (flags start with --)"
    name = token[2:].split("=", 1)[0]
    close = difflib.get_close_matches(name, FLAGS_BY_NAME, n=1)
    hint = f" (did you mean --{close[0]}?)" if close else ""
    return f"unknown flag --{name}{hint}"


def _flag_groups(argv: list[str]) -> list[list[str]]:
    """``--flag [values...]`` groups in order; leading stray tokens form a group of their own."""
    groups: list[list[str]] = []
    for token in argv:
        if token.startswith("--") or not groups:
            groups.append([token])
        else:
            groups[-1].append(token)
    return groups


def _parse_command_line(argv: list[str], p: Problems) -> tuple[dict[str, Any], dict[str, Any]]:
    """Each ``--flag values`` group is parsed on its own, so every bad flag or value is reported, not the first."""
    rest, passthrough = p.run(_split_passthrough, list(argv)) or ([], {})
    parser = build_parser()
    explicit: dict[str, Any] = {}
    for group in _flag_groups(rest):
        try:
            namespace, extra = parser.parse_known_args(group)
        except ConfigError as exc:  # argparse's message names the flag ("argument --lr: ...")
            p.add(str(exc))
            continue
        explicit.update(vars(namespace))
        if extra and extra[0] == group[0]:
            p.add(_unknown(extra[0]))
        elif extra:
            p.add(_unknown(extra[0]) + f" after {group[0]}")
    return explicit, passthrough


# ---------------------------------------------------------------------- layers
def _lower_layers(explicit: dict[str, Any], p: Problems) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """Preset values overlaid by config-file values; plus the files' sglang passthrough and the
    ``--custom-config-path`` keys that are not flags (recipe settings, set on ``args`` as they are)."""
    from_files: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    extras: dict[str, Any] = {}
    for dest in ("config", "custom_config_path"):
        if explicit.get(dest):
            loaded = load_config_file(explicit[dest], format_flag(dest), p, allow_extra=dest == "custom_config_path")
            from_files.update(loaded.values)
            passthrough.update(loaded.passthrough)
            extras.update(loaded.extra)
    preset_name = explicit.get("preset") or from_files.get("preset")
    layers: dict[str, Any] = {}
    if preset_name:
        for dest, value in (p.run(get_preset, preset_name) or {}).items():
            spec = FLAGS_BY_NAME.get(dest.replace("_", "-"))
            if spec is None:
                p.add(f"--preset {preset_name}: unknown key {dest!r}")
                continue
            layers[dest] = p.run(typed_value, spec, value, where=f"--preset {preset_name}: key {dest!r}")
        layers["preset"] = preset_name
    layers.update(from_files)
    return layers, passthrough, extras


def check_supported(args: argparse.Namespace) -> None:
    """Refuse, in table order, every flag whose feature does not exist yet (all of them in one error).

    A flag that is not supported may only keep its documented default; a choice flag with
    ``supported_values`` may only take those. Runs before derived values are filled in, so
    implied settings (``--colocate`` -> offload) never trip it.
    """
    p = Problems()
    for spec in FLAGS:
        value = getattr(args, spec.dest)
        if spec.supported_values is not None and value is not None and value not in spec.supported_values:
            p.add(f"not supported yet: --{spec.name} {value}" + (f" ({spec.not_yet_why})" if spec.not_yet_why else ""))
        elif not spec.supported and value != spec.default:
            p.add(f"not supported yet: --{spec.name}" + (f" ({spec.not_yet_why})" if spec.not_yet_why else ""))
    p.raise_if_any()


def _check_required(args: argparse.Namespace, p: Problems) -> None:
    for spec in FLAGS:
        if spec.required and getattr(args, spec.dest) is None:
            p.add(f"--{spec.name} is required")


# ---------------------------------------------------------------------- entry
def parse_args(argv: list[str]) -> argparse.Namespace:
    """Parse, layer, gate and validate ``relax train`` flags; raise ConfigError naming every problem found.

    Problems of one stage are all collected (every unknown flag, every bad config key, every broken
    rule); a later stage runs only when the earlier ones found none, since its checks would read
    values that are already known to be wrong.
    """
    p = Problems()
    explicit, cli_passthrough = _parse_command_line(argv, p)
    lower, passthrough, extras = _lower_layers(explicit, p)
    p.raise_if_any()
    values = {spec.dest: copy.deepcopy(spec.default) for spec in FLAGS}
    values.update(lower)
    values.update(explicit)
    args = argparse.Namespace(**values)
    for key, value in extras.items():  # recipe settings from --custom-config-path (seed 004: setattr(args, k, v))
        setattr(args, key, value)
    args.sglang_passthrough = {**passthrough, **cli_passthrough}
    args.notices = []  # lines printed at start and kept in run.json (a default resolved on the machine)
    if extras:
        args.notices.append(recipe_keys_notice(f"--custom-config-path {args.custom_config_path}", list(extras)))
    given = frozenset(lower) | frozenset(explicit)
    _check_required(args, p)
    _check_bounds(args, p)
    p.run(check_machine, args, given, p)  # GPU-only flags on a machine without one: refused here, reset
    p.run(check_supported, args)
    p.run(resolve_and_validate, args, frozenset(explicit), p)
    p.raise_if_any()
    if args.output_dir is None:
        args.output_dir = f"runs/{time.strftime('%Y%m%d-%H%M%S')}"
    return args


def _check_bounds(args: argparse.Namespace, p: Problems) -> None:
    """Every flag's value range (`relax.utils.flag_table.BOUNDS`), one line per value outside it."""
    for spec in FLAGS:
        value = getattr(args, spec.dest, None)
        if spec.bound is not None and value is not None and not spec.bound.admits(value):
            p.add(f"--{spec.name} must be {spec.bound}, got {value!r}")


def args_to_dict(args: argparse.Namespace) -> dict[str, Any]:
    """A JSON-serializable copy of every parsed value (for run.json)."""
    return json.loads(json.dumps(vars(args), default=str))
