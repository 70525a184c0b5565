"""Read a run directory as docs/artifacts.md defines it. Checks see runs only through this.

Readers tolerate a torn last line (a run killed mid-write) and the engine's string encoding
of non-finite floats ("nan", "inf"), so a crashed run can still be judged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FILES = ("metrics.jsonl", "weights.jsonl", "events.jsonl", "samples.jsonl", "run.json")
_NONFINITE = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "infinity": math.inf, "-infinity": -math.inf}


def read_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """All complete JSON objects of a JSON Lines file ([] when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        line = line.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue  # torn line of a killed writer
        if isinstance(obj, dict):
            records.append(obj)
    return records


def as_float(value: Any) -> float | None:
    """A metric value as float: numbers, and the strings the engine writes for nan/inf."""
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, str):
        return _NONFINITE.get(value.strip().lower())
    return None


@dataclass
class RunArtifacts:
    """The artifact files of one run directory, loaded once."""

    dir: Path
    metrics: list[dict[str, Any]] = field(default_factory=list)
    weights: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    samples: list[dict[str, Any]] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def load(cls, directory: str | Path) -> RunArtifacts:
        d = Path(directory)
        run: dict[str, Any] = {}
        if (d / "run.json").exists():
            try:
                run = json.loads((d / "run.json").read_text())
            except json.JSONDecodeError:
                run = {}
        return cls(
            dir=d,
            metrics=read_jsonl(d / "metrics.jsonl"),
            weights=read_jsonl(d / "weights.jsonl"),
            events=read_jsonl(d / "events.jsonl"),
            samples=read_jsonl(d / "samples.jsonl"),
            run=run,
        )

    def metric_series(self, key: str) -> dict[int, float]:
        """step -> value for one metric key (the last record of a step wins, e.g. after a resume)."""
        out: dict[int, float] = {}
        for rec in self.metrics:
            if "step" in rec and key in rec:
                value = as_float(rec[key])
                if value is not None:
                    out[int(rec["step"])] = value
        return dict(sorted(out.items()))

    def steps(self) -> list[int]:
        return sorted({int(r["step"]) for r in self.metrics if "step" in r})

    def events_named(self, name: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("event") == name]

    @property
    def status(self) -> str | None:
        return self.run.get("status")

    @property
    def error(self) -> str | None:
        return self.run.get("error")
