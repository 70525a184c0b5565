"""A finished (or running) run directory read back: its metrics per step, its events and run.json.

Shared by ``relax report`` (report.py) and the timeline (timeline.py). A line that is not a JSON object (cut short
by a run killed mid-write, or edited by hand) is skipped and named in ``RunFiles.unreadable``; a value the writer
stored as a string (``"nan"``) reads back as a float.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RunDirError(ValueError):
    """RUN_DIR is not a run directory; the message is one line."""


def read_jsonl(path: Path, unreadable: list[str] | None = None) -> list[dict[str, Any]]:
    """The JSON objects of ``path``'s lines; ``unreadable`` receives ``name:line`` of each other non-blank line."""
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif line.strip() and unreadable is not None:
            unreadable.append(f"{path.name}:{lineno}")
    return records


def as_float(value: Any) -> float | None:
    if isinstance(value, bool):
        return float(value)
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        try:
            return float(value)  # "nan" / "inf" as the writer stores them
        except ValueError:
            return None
    return None


@dataclass
class RunFiles:
    directory: Path
    steps: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl, the last record of each step
    events: list[dict[str, Any]] = field(default_factory=list)
    run_info: dict[str, Any] = field(default_factory=dict)
    unreadable: list[str] = field(default_factory=list)  # "metrics.jsonl:7": lines skipped, not JSON objects

    @property
    def config(self) -> dict[str, Any]:
        return self.run_info.get("config") or {}

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric over the steps that logged it (non-finite values as NaN)."""
        xs, ys = [], []
        for record in self.steps:
            value = as_float(record.get(key))
            if value is not None:
                xs.append(int(record["step"]))
                ys.append(value if math.isfinite(value) else float("nan"))
        return xs, ys

    def has(self, key: str) -> bool:
        return any(key in record for record in self.steps)

    @property
    def start_time(self) -> float | None:
        times = [e["time"] for e in self.events if isinstance(e.get("time"), int | float)]
        return min(times) if times else self.run_info.get("start_time")


def load_run(directory: str | Path) -> RunFiles:
    """Read RUN_DIR, or raise `RunDirError` saying in one line why it is not a run directory."""
    root = Path(directory)
    if not root.exists():
        raise RunDirError(f"{root}: no such directory")
    if not root.is_dir():
        raise RunDirError(f"{root}: not a directory")
    if not (root / "metrics.jsonl").exists() and not (root / "run.json").exists():
        raise RunDirError(f"{root}: not a run directory (no metrics.jsonl or run.json; give the --output-dir of a run)")
    run_info: dict[str, Any] = {}
    if (root / "run.json").exists():
        try:
            run_info = json.loads((root / "run.json").read_text())
        except (OSError, ValueError) as exc:
            raise RunDirError(f"{root / 'run.json'}: unreadable ({exc})") from None
    by_step: dict[int, dict[str, Any]] = {}
    unreadable: list[str] = []
    for record in read_jsonl(root / "metrics.jsonl", unreadable):
        if isinstance(record.get("step"), int):
            by_step[record["step"]] = record  # a resumed or rolled-back step: its last record
    events = sorted(read_jsonl(root / "events.jsonl", unreadable), key=lambda e: e.get("time") or 0.0)
    return RunFiles(root, [by_step[s] for s in sorted(by_step)], events, run_info, unreadable)
