"""Generate docs/flags.md from the flag table: ``python -m relax.utils.flag_docs > docs/flags.md``."""

from __future__ import annotations

import sys

from relax.utils.flag_table import FLAGS
from relax.utils.flag_types import format_size


def _default(spec) -> str:
    if spec.seed_default is not None:
        return f"{spec.default!r} (seed: {spec.seed_default})"
    if spec.type == "size" and isinstance(spec.default, int):
        return f"{format_size(spec.default)} ({spec.default} bytes)"
    return "required" if spec.required else repr(spec.default)


def _status(spec) -> str:
    if spec.supported_values is not None:
        return "yes: " + ", ".join(sorted(map(str, spec.supported_values)))
    return "yes" if spec.supported else "not yet"


def _hook_notes() -> dict[str, str]:
    """Each hook flag's signature and when it is called, as docs/rewards.md gives them (relax.utils.hook_docs)."""
    from relax.utils.hook_docs import hooks

    notes: dict[str, list[str]] = {}
    for label, signature, when in hooks():
        flag, _, variant = label.partition(" ")
        if flag.startswith("--"):
            where = f"{variant.strip('()')}: " if variant else ""
            notes.setdefault(flag[2:], []).append(f"{where}`{signature}`, called {when}")
    return {name: "Hook: " + "; ".join(parts) + " (docs/rewards.md)." for name, parts in notes.items()}


def render() -> str:
    hook_notes = _hook_notes()
    lines = [
        "# `relax train` flags",
        "",
        "Generated from `relax/utils/flag_table.py` by `python -m relax.utils.flag_docs`; do not edit by hand.",
        "A flag marked *not yet* parses with its documented type and default and exits 2 with",
        "`relax: not supported yet: --flag` when given any other value. `--sglang-X` flags not listed here",
        "are SGLang's own options `--X` (every option of SGLang's `ServerArgs`, pinned with its version in",
        "`relax/backends/sglang/server_args.json`), passed to the SGLang servers of `--rollout-backend sglang`;",
        "an option SGLang does not have, or one the launcher sets from Relax's flags, is refused by name.",
        "",
        "Values are layered: documented default < `--preset` < `--config` / `--custom-config-path` YAML",
        "(keys are flag names with `-` or `_`) < flags on the command line, whatever their order.",
        "Sizes accept plain bytes or `512MB`, `1GB` (binary multiples). `bool` flags take `true` or `false`.",
    ]
    group = None
    for spec in FLAGS:
        if spec.group != group:
            group = spec.group
            lines += ["", f"## {group}", "", "| flag | type | default | implemented | description |", "|---|---|---|---|---|"]
        choices = f" Choices: {', '.join(spec.choices)}." if spec.choices else ""
        bound = f" Must be {spec.bound}." if spec.bound else ""
        hook = hook_notes.get(spec.name)
        text = spec.help if hook is None else f"{spec.help.rstrip('. ')}. {hook}"
        help_ = (text + choices + bound).replace("|", "\\|")
        lines.append(f"| `--{spec.name}` | {spec.type} | {_default(spec)} | {_status(spec)} | {help_} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(render())
