"""Throughput baselines in ``ci/baselines/<key>.json``. Only an explicit command updates them.

File shape::

    {"key": "colocate-cpu",
     "cpu": {"calibration_s": 0.021, "updated": "...",
             "metrics": {"perf/tokens_per_s": {"normalized": 183.0, "raw": 8700.0, "higher_is_better": true}}},
     "gpu": {"H100": {"updated": "...", "metrics": {...}}}}

CPU numbers are normalized by the in-run calibration (``harness.calibration``); GPU numbers
are kept per device class and compared raw.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from harness.profiles import Profile


def baseline_path(directory: Path, key: str) -> Path:
    return Path(directory) / f"{key}.json"


def load(directory: Path, key: str) -> dict[str, Any] | None:
    path = baseline_path(directory, key)
    return json.loads(path.read_text()) if path.exists() else None


def entry(data: dict[str, Any] | None, profile: Profile | str, device_class: str) -> dict[str, Any] | None:
    if not data:
        return None
    if Profile(profile) is Profile.CPU:
        return data.get("cpu")
    return (data.get("gpu") or {}).get(device_class)


def normalize(value: float, higher_is_better: bool, calibration_s: float | None) -> float:
    """Machine-independent figure: rates x calibration seconds, durations / calibration seconds."""
    if not calibration_s:
        return value
    return value * calibration_s if higher_is_better else value / calibration_s


def compare(metric: str, value: float, base: dict[str, Any], tolerance: float) -> tuple[bool, str]:
    """``value`` is normalized; ``base`` is the baseline's entry for this metric."""
    ref = float(base["normalized"])
    higher = bool(base.get("higher_is_better", True))
    change = (value - ref) / ref if ref else 0.0
    if higher:
        ok = value >= ref * (1 - tolerance)
    else:
        ok = value <= ref * (1 + tolerance)
    word = "ok" if ok else "REGRESSION"
    return ok, f"{metric}: {value:.4g} vs baseline {ref:.4g} ({change:+.1%}, tolerance {tolerance:.0%}) {word}"


def update(directory: Path, key: str, profile: Profile | str, device_class: str,
           calibration_s: float | None, measurements: dict[str, dict[str, Any]]) -> Path:
    """Write this job's measurements as the new baseline for (key, profile, device class)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    data = load(directory, key) or {"key": key}
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    new = {"updated": stamp, "metrics": measurements}
    if Profile(profile) is Profile.CPU:
        new["calibration_s"] = calibration_s
        data["cpu"] = new
    else:
        data.setdefault("gpu", {})[device_class] = new
    path = baseline_path(directory, key)
    path.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    return path


def update_from_results(results: dict[str, Any], directory: Path) -> list[Path]:
    """Update every baseline a results JSON measured (``relax-harness baseline update``)."""
    written = []
    for sc in results.get("scenarios", []):
        for check in sc.get("checks", []):
            if check.get("kind") != "throughput" or not check.get("measurements"):
                continue
            key = check["details"].get("baseline_key") or sc.get("baseline_key")
            if not key:
                continue
            written.append(update(directory, key, sc.get("profile", "cpu"), sc.get("device_class", "cpu"),
                                  sc.get("calibration_s"), check["measurements"]))
    return written
