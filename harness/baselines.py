"""Stored throughput baselines, one file per machine class: ``ci/baselines/<class slug>.json``.

Only ``relax-harness baseline record`` writes them, from at least `MIN_RUNS` runs of each scenario on
that machine class. File shape::

    {"schema": "relax-harness-baselines/2", "machine_class": "gpu: NVIDIA H100 80GB HBM3 x1",
     "scenarios": {"colocate-gpu": {"metric": "samples_per_s", "values": [...], "median": 212.0,
                                    "spread": 0.021, "tolerance": 0.063, "spec": "<digest>",
                                    "recorded": "2026-11-25T10:00:00Z", "commit": "abc123"}}}

A measurement fails only when it is below ``median * (1 - allowed)``, where ``allowed`` is the larger of
the baseline's own ``tolerance`` (3 x the relative standard deviation of its runs: the noise measured on
that machine) and the check's minimum (its ``tolerance``, else the profile's). A class without an entry,
or with an entry recorded for other scenario flags (``spec`` differs), has *no baseline*: that is its
own outcome, never a pass.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.profiles import class_slug

SCHEMA = "relax-harness-baselines/2"
MIN_RUNS = 5
SPREAD_SIGMAS = 3.0


def baseline_path(directory: Path, machine: str) -> Path:
    return Path(directory) / f"{class_slug(machine)}.json"


def load(directory: Path, machine: str) -> dict[str, Any] | None:
    path = baseline_path(directory, machine)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    if data.get("schema") != SCHEMA:
        raise ValueError(f"{path}: schema {data.get('schema')!r}, expected {SCHEMA!r}; re-record it with "
                         "`relax-harness baseline record`")
    return data


def entry(directory: Path | None, machine: str, key: str) -> dict[str, Any] | None:
    data = load(directory, machine) if directory is not None else None
    return ((data or {}).get("scenarios") or {}).get(key)


def spread_tolerance(values: list[float]) -> float:
    """3 x the relative (sample) standard deviation of the recorded runs."""
    if len(values) < 2:
        return 0.0
    return SPREAD_SIGMAS * statistics.stdev(values) / statistics.median(values)


@dataclass(frozen=True)
class Judgement:
    ok: bool
    median: float
    allowed: float  # relative drop allowed
    change: float  # (value - median) / median

    @property
    def lower(self) -> float:
        return self.median * (1 - self.allowed)

    def line(self, metric: str, value: float) -> str:
        word = "ok" if self.ok else "REGRESSION"
        return (f"{metric} {value:.4g} vs baseline median {self.median:.4g} ({self.change:+.1%}; fails below "
                f"{self.lower:.4g}, -{self.allowed:.0%}) {word}")


def judge(value: float, base: dict[str, Any], min_tolerance: float) -> Judgement:
    median = float(base["median"])
    allowed = max(float(base.get("tolerance", 0.0)), min_tolerance)
    change = (value - median) / median if median else 0.0
    return Judgement(value >= median * (1 - allowed), median, allowed, change)


def missing_reason(base: dict[str, Any] | None, machine: str, key: str, spec_digest: str | None) -> str | None:
    """Why there is no usable baseline for ``key`` on ``machine`` (None: there is one)."""
    if base is None:
        return f"no baseline for {machine} (scenario {key}); record one with `relax-harness baseline record`"
    if spec_digest is not None and base.get("spec") not in (None, spec_digest):
        return (f"no baseline for {machine} (scenario {key}): the stored one was recorded for other scenario flags "
                f"(spec {base.get('spec')} != {spec_digest}); re-record it with `relax-harness baseline record`")
    return None


def record(directory: Path, machine: str, measured: dict[str, list[dict[str, Any]]], commit: str | None) -> Path:
    """Write ``measured`` (scenario key -> one measurement per run: value, metric, spec) as the baselines of
    ``machine``, keeping the file's other scenarios. Needs `MIN_RUNS` runs per scenario."""
    directory = Path(directory)
    path = baseline_path(directory, machine)
    data = load(directory, machine) or {"schema": SCHEMA, "machine_class": machine, "scenarios": {}}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    for key, runs in measured.items():
        if len(runs) < MIN_RUNS:
            raise ValueError(f"{key}: a baseline needs at least {MIN_RUNS} runs, got {len(runs)}")
        metrics = {r["metric"] for r in runs}
        specs = {r.get("spec") for r in runs}
        if len(metrics) != 1 or len(specs) != 1:
            raise ValueError(f"{key}: runs disagree on the metric {sorted(metrics)} or the scenario spec "
                             f"{sorted(map(str, specs))}; record runs of one scenario version")
        values = [float(r["value"]) for r in runs]
        data["scenarios"][key] = {"metric": metrics.pop(), "values": values, "median": statistics.median(values),
                                  "spread": spread_tolerance(values) / SPREAD_SIGMAS,
                                  "tolerance": spread_tolerance(values), "spec": specs.pop(), "runs": len(values),
                                  "recorded": stamp, "commit": commit}
    directory.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def measurements_from_results(results: list[dict[str, Any]]) -> tuple[str, dict[str, list[dict[str, Any]]]]:
    """(machine class, scenario key -> measurements) from results JSONs (``baseline record --from``).

    Only passed scenarios count: a failing run's throughput is no baseline."""
    machines: set[str] = set()
    measured: dict[str, list[dict[str, Any]]] = {}
    for data in results:
        for sc in data.get("scenarios", []):
            for check in sc.get("checks", []):
                m = check.get("measurements") or {}
                if check.get("kind") != "throughput" or "value" not in m:
                    continue
                if sc.get("status") != "passed" and not _only_throughput_failed(sc):
                    raise ValueError(f"{sc['name']}: the run did not pass ({sc.get('message')}); its throughput "
                                     "is no baseline")
                machines.add(sc["machine_class"])
                measured.setdefault(m["baseline_key"], []).append(m)
    if len(machines) > 1:
        raise ValueError(f"results come from several machine classes: {sorted(machines)}")
    if not machines:
        raise ValueError("no throughput measurements in the results")
    return machines.pop(), measured


def _only_throughput_failed(sc: dict[str, Any]) -> bool:
    """A run that failed only its throughput comparison (e.g. against an old baseline) still measured."""
    failed = [c for c in sc.get("checks", []) if c.get("status") == "failed"]
    return not sc.get("problems") and bool(failed) and all(c.get("kind") == "throughput" for c in failed)
