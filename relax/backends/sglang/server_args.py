"""``--sglang-*`` flags -> SGLang ``ServerArgs`` command-line options (seed 000: every SGLang parameter,
prefixed ``--sglang-``).

The options are SGLang's own, pinned from ``sglang/srt/server_args.py`` at the version named in
server_args.json (``ci/pin_sglang_server_args.py`` writes it; tests/sglang/ checks it against an
installed ``sglang``). ``--sglang-X`` is accepted when ``--X`` is one of SGLang's option strings;
its value is typed and checked as SGLang's parser would, and it reaches ``sglang.launch_server``
spelled SGLang's way. Options the launcher itself sets from Relax's flags (the model, the port, the
tensor-parallel size, the seed, ...) are refused with the Relax flag to use instead.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from relax.utils.flag_types import ConfigError, parse_bool

PINNED = Path(__file__).with_name("server_args.json")

# ServerArgs fields the launcher sets (launcher.py), and where their value comes from instead
RESERVED: dict[str, str] = {
    "model_path": "--hf-checkpoint", "tokenizer_path": "--hf-checkpoint", "host": "the launcher (loopback)",
    "port": "the launcher (a free port)", "tp_size": "--rollout-num-gpus-per-engine",
    "random_seed": "--seed (plus the engine index)", "base_gpu_id": "the engine's Ray placement",
    "nccl_port": "the launcher (a free port)", "dtype": "the trainer's export dtype", "api_key": "the run",
    "enable_memory_saver": "--offload-rollout", "weight_version": "the weight syncs", "dist_init_addr": "the launcher",
    "nnodes": "the launcher (one node per engine)", "node_rank": "the launcher",
}
_TYPES = {"int": int, "float": float, "str": str, "nullable_str": str, "human_readable_int": int}
# argparse actions as server_args.json names them (ci/pin_sglang_server_args.py); SGLang 0.5.14 keeps renamed
# options working through its Deprecated* actions, which behave as the plain ones they wrap
SWITCH_ACTIONS = frozenset({"'store_true'", "'store_const'", "DeprecatedStoreTrueAction", "DeprecatedStoreConstAction"})
VALUE_ACTIONS = frozenset({None, "'store'", "DeprecatedAliasStoreAction"})


@dataclass(frozen=True)
class SGLangOption:
    flags: tuple[str, ...]
    dest: str
    action: str | None
    type: str | None
    nargs: Any
    choices: tuple | None

    @property
    def flag(self) -> str:
        return self.flags[0]

    @property
    def is_switch(self) -> bool:
        """Given or not, no value: store_true / store_const, and SGLang 0.5.14's deprecated forms of them."""
        return self.action in SWITCH_ACTIONS

    def tokens(self, value: Any, given_as: str) -> list[str]:
        """The command-line tokens of ``value`` for this option; ConfigError naming ``given_as``."""
        if self.is_switch:
            on = _bool(value, given_as)
            return [self.flag] if on else []
        if self.action and "BooleanOptionalAction" in self.action:
            return [self.flag if _bool(value, given_as) else "--no-" + self.flag[2:]]
        if self.action not in VALUE_ACTIONS:
            raise ConfigError(f"{given_as}: SGLang's {self.flag} ({self.action}) is not supported by the launcher yet")
        if self.nargs in ("+", "*") or isinstance(self.nargs, int):
            values = _as_list(value)
        elif isinstance(value, list | tuple):
            raise ConfigError(f"{given_as}: SGLang's {self.flag} takes one value, got {len(value)}: "
                              f"{' '.join(map(str, value))}")
        else:
            values = [value]
        cast = _TYPES.get(self.type or "str")
        out = [self.flag]
        for item in values:
            text = json.dumps(item) if isinstance(item, dict | list) else str(item)
            if cast is not None:
                try:
                    cast(text) if cast is not str else text
                except ValueError:
                    raise ConfigError(f"{given_as} {item!r}: SGLang's {self.flag} takes {self.type}") from None
            if self.choices and text not in [str(c) for c in self.choices]:
                raise ConfigError(f"{given_as} {item!r}: one of {', '.join(map(str, self.choices))}")
            out.append(text)
        return out


def _bool(value: Any, given_as: str) -> bool:
    try:
        return parse_bool(value)
    except ValueError:
        raise ConfigError(f"{given_as} {value!r}: a switch, true or false") from None


def _as_list(value: Any) -> list:
    if isinstance(value, list | tuple):
        return list(value)
    return [v for v in str(value).replace(",", " ").split() if v]


@cache
def pinned() -> tuple[str, dict[str, SGLangOption]]:
    """(SGLang version, option by every long flag without its dashes)."""
    data = json.loads(PINNED.read_text())
    by_name: dict[str, SGLangOption] = {}
    for raw in data["options"]:
        option = SGLangOption(tuple(raw["flags"]), raw["dest"], raw["action"], raw["type"], raw["nargs"],
                              tuple(raw["choices"]) if raw["choices"] else None)
        for flag in option.flags:
            by_name[flag[2:]] = option
    return data["sglang_version"], by_name


def server_arg_tokens(passthrough: dict[str, Any]) -> list[str]:
    """``{"mem_fraction_static": 0.7, ...}`` (``--sglang-*`` flags, dests) -> SGLang command-line tokens.

    Every problem is a ConfigError naming the ``--sglang-*`` flag; the first one found is raised.
    """
    version, options = pinned()
    tokens: list[str] = []
    for key, value in passthrough.items():
        name = key.replace("_", "-")
        given_as = f"--sglang-{name}"
        option = options.get(name)
        if option is None:
            import difflib

            close = difflib.get_close_matches(name, options, n=1)
            hint = f" (did you mean --sglang-{close[0]}?)" if close else ""
            raise ConfigError(f"{given_as}: SGLang {version} has no option --{name}{hint}")
        if option.dest in RESERVED:
            raise ConfigError(f"{given_as}: set by {RESERVED[option.dest]}, not by a --sglang-* flag")
        tokens += option.tokens(value, given_as)
    return tokens
