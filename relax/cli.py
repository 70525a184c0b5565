"""The ``relax`` command: a registry of subcommands, each a module with ``main(argv) -> int``."""

from __future__ import annotations

import importlib
import logging
import os
import sys

SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "train": ("relax.entrypoints.train", "train a policy with RL (flags: docs/flags.md)"),
    "serve-engine": ("relax.backends.embedded.server", "serve the embedded engine over SGLang's HTTP API"),
    "convert-data": ("relax.data.convert_verl", "convert a verl parquet (prompt, reward_model, extra_info) to relax's"),
    "convert": ("relax.entrypoints.convert", "convert checkpoints between HF and Megatron (TP/PP/EP layouts)"),
    "report": ("relax.observability.report", "one self-contained HTML page of a run's metrics, events and config"),
}


def _usage() -> str:
    lines = ["usage: relax <command> [flags]", "", "commands:"]
    lines += [f"  {name:<14} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"relax: unknown command {name!r}\n{_usage()}", file=sys.stderr)
        return 2
    module = importlib.import_module(SUBCOMMANDS[name][0])
    return int(module.main(rest))


def run() -> None:
    """The ``relax`` program (console script and ``python -m relax.cli``): `main`, then a quiet exit.

    The interpreter's finalization is skipped: by then the run has closed every file it writes and shut Ray
    down, and finalizing only adds third-party noise (triton's nanobind extension, which torch imports,
    reports ~600 of its objects as leaked on stderr after every run)."""
    code = main()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
