"""Synthetic learnable tasks, registered by name, with the datasets the presets ship.

``python -m relax.models.tasks NAME --out FILE.jsonl`` regenerates a dataset; the shipped
files are exactly what this prints (a test checks it).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

TASK_DIR = Path(__file__).parent


def addmod() -> Iterator[dict[str, str]]:
    """``a+b=`` -> ``(a+b) mod 10``: a one-token answer; learnable by RL from random init, but
    whether a run gets past ~0.5 reward in 600 steps depends on the rollout seed."""
    for a in range(10):
        for b in range(10):
            yield {"prompt": f"{a}+{b}=", "label": str((a + b) % 10)}


def maxdigit() -> Iterator[dict[str, str]]:
    """``a,b=`` -> ``max(a, b)``: the quickstart's task. A one-token answer that depends on both
    operands; a random-init tiny model learns it by RL within ~100 steps on every rollout seed
    tried, whereas ``addmod`` (modular addition) stalls at 0.1-0.5 reward on most seeds."""
    for a in range(10):
        for b in range(10):
            yield {"prompt": f"{a},{b}=", "label": str(max(a, b))}


def add() -> Iterator[dict[str, str]]:
    """``a+b=`` -> ``a+b`` (one or two digits, then EOS): needs a warm start to learn by RL."""
    for a in range(10):
        for b in range(10):
            yield {"prompt": f"{a}+{b}=", "label": str(a + b)}


def maxword() -> Iterator[dict[str, str]]:
    """``w<a> w<b>`` -> ``w<max(a, b)>``: maxdigit spelled in the word-level vocabulary of the GPU presets
    (bench-270m, qwen3-0.5b, bench-1b), whose tokenizer knows only the words ``w0``, ``w1``, ... (digits
    and punctuation would encode to its pad id)."""
    for a in range(10):
        for b in range(10):
            yield {"prompt": f"w{a} w{b}", "label": f"w{max(a, b)}"}


def colorshape() -> Iterator[dict[str, object]]:
    """The VLM quickstart's picture question (relax/models/tasks/shapes.py)."""
    from relax.models.tasks.shapes import colorshape as rows

    return rows()


TASKS: dict[str, Callable[[], Iterator[dict[str, object]]]] = {"addmod": addmod, "maxdigit": maxdigit, "add": add,
                                                                 "maxword": maxword, "colorshape": colorshape}


def render(name: str) -> str:
    return "".join(json.dumps(r) + "\n" for r in TASKS[name]())


def dataset_path(name: str) -> Path:
    return TASK_DIR / f"{name}.jsonl"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relax.models.tasks")
    parser.add_argument("task", choices=sorted(TASKS))
    parser.add_argument("--out", required=True)
    ns = parser.parse_args(argv)
    Path(ns.out).write_text(render(ns.task))
    return 0


if __name__ == "__main__":
    sys.exit(main())
