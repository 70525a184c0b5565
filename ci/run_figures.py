"""The figures of one ``relax train`` run, derived from its artifacts: where a step's time goes, and the
weight sync's seconds per GB, so that no figure in the docs has to be read off events.jsonl by hand.

    python ci/run_figures.py RUN_DIR [--warmup 2] [--json OUT.json]

From ``metrics.jsonl`` (docs/artifacts.md), over the steps after the first ``--warmup``: the median
``perf/step_time_s`` and of its phases ``perf/rollout_time_s``, ``perf/train_time_s`` and
``perf/sync_time_s`` (each with its share of the step), the rest of the step (reward, advantages,
bookkeeping: step - rollout - train - sync), the colocate memory moves (``perf/<move>_time_s``,
inside the phases above) and the sub-phases ``perf/rollout_generate_time_s``, ``rollout_engine``, ``rollout_reward``,
``train_columns`` and ``train_update`` (inside rollout and train) where the run logged them. From ``events.jsonl``'s ``weights_synced`` events of those steps: GB per
sync, median seconds and s/GB of the whole sync (both sides' checksums included, the figure the
0.05 s/GB target is about), and of its phases ``prepare_s``, ``transfer_s`` and ``checksums_s``.
The JSON carries this script's provenance and the run's own ``run.json`` identity (status, device,
versions), so a quoted figure leads back to both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ci.provenance when run as a script
from ci.provenance import provenance  # noqa: E402

PHASES = ("rollout", "train", "sync")
MOVES = ("release_rollout", "resume_rollout", "offload_train", "onload_train")  # docs/artifacts.md: colocate moves
SYNC_PHASES = ("prepare_s", "transfer_s", "checksums_s")
SUB_PHASES = ("rollout_generate", "rollout_engine", "rollout_reward", "train_columns", "train_update")  # docs/artifacts.md


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        raise FileNotFoundError(f"{path}: not found (is {path.parent} a relax train --output-dir?)")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not JSON ({exc.msg})") from None
    return rows


def train_run(bench: str, name: str, flags: list[str], out: Path, keep: Path | None = None) -> Path:
    """``relax train FLAGS --output-dir OUT`` for a bench's run ``name`` (one torch thread per process); ``keep``
    gets a copy of its events.jsonl and metrics.jsonl as ``<name>_<file>``. SystemExit naming the bench and the
    run, with stderr's tail, when the run fails. Returns ``out``."""
    proc = subprocess.run([sys.executable, "-m", "relax.cli", "train", *flags, "--output-dir", str(out)],
                          env=dict(os.environ, OMP_NUM_THREADS="1"), capture_output=True, text=True)
    if keep:
        keep.mkdir(parents=True, exist_ok=True)
        for f in ("events.jsonl", "metrics.jsonl"):
            if (out / f).exists():
                (keep / f"{name}_{f}").write_text((out / f).read_text())
    if proc.returncode:
        raise SystemExit(f"{bench}: the {name} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return out


def _median(values: list[float]) -> float | None:
    return statistics.median(values) if values else None


def step_phases(metrics: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """Median seconds of the step and its phases over the timed steps, and each phase's share."""
    timed = metrics[warmup:]
    if not timed:
        raise ValueError(f"no step after the first {warmup} (--warmup) of {len(metrics)}")
    step = _median([float(m["perf/step_time_s"]) for m in timed])
    phases = {p: _median([float(m[f"perf/{p}_time_s"]) for m in timed if f"perf/{p}_time_s" in m]) for p in PHASES}
    rest = _median([float(m["perf/step_time_s"]) - sum(float(m.get(f"perf/{p}_time_s", 0.0)) for p in PHASES)
                    for m in timed])
    moves = {mv: _median([float(m[f"perf/{mv}_time_s"]) for m in timed if f"perf/{mv}_time_s" in m]) for mv in MOVES}
    subs = {sp: _median([float(m[f"perf/{sp}_time_s"]) for m in timed if f"perf/{sp}_time_s" in m])
            for sp in SUB_PHASES}
    return {"steps": len(metrics), "steps_timed": len(timed), "step_s": step,
            "phases_s": {**phases, "other": rest},
            "phases_share": {k: (v / step if v is not None and step else None) for k, v in {**phases, "other": rest}.items()},
            "memory_moves_s": {k: v for k, v in moves.items() if v is not None},
            "sub_phases_s": {k: v for k, v in subs.items() if v is not None}}


def sync_figures(events: list[dict[str, Any]], warmup: int) -> dict[str, Any] | None:
    """Sync s/GB and its phases over the ``weights_synced`` events of the timed steps (None: no sync)."""
    synced = [e for e in events if e.get("event") == "weights_synced" and e.get("bytes")]
    timed = [e for e in synced if int(e.get("step", 0)) >= warmup] or synced[-1:]
    if not timed:
        return None
    gb = [e["bytes"] / 1e9 for e in timed]
    seconds = [float(e["seconds"]) for e in timed]
    out: dict[str, Any] = {
        "syncs": len(synced), "syncs_timed": len(timed), "gb_per_sync": _median(gb), "seconds": _median(seconds),
        "s_per_gb": _median([s / g for s, g in zip(seconds, gb, strict=True)]),
        "transports": sorted({t for e in synced for t in e.get("transports", [])}),
        "phases_s": {}, "phases_s_per_gb": {}}
    for phase in SYNC_PHASES:
        pairs = [(float(e[phase]), e["bytes"] / 1e9) for e in timed if phase in e]
        if pairs:
            out["phases_s"][phase] = _median([s for s, _ in pairs])
            out["phases_s_per_gb"][phase] = _median([s / g for s, g in pairs])
    return out


def run_identity(run_dir: Path) -> dict[str, Any]:
    path = run_dir / "run.json"
    if not path.exists():
        return {}
    data = json.loads(path.read_text())
    return {k: data.get(k) for k in ("status", "device", "dtypes", "versions", "start_time", "end_time")}


def figures(run_dir: Path, warmup: int) -> dict[str, Any]:
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    events = read_jsonl(run_dir / "events.jsonl") if (run_dir / "events.jsonl").exists() else []
    return {"run_dir": str(run_dir.resolve()), "run": run_identity(run_dir), "warmup": warmup,
            "step": step_phases(metrics, warmup), "sync": sync_figures(events, warmup)}


def _s(value: float | None, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def report(fig: dict[str, Any]) -> str:
    step = fig["step"]
    lines = [f"{fig['run_dir']}: {step['steps']} steps, medians over the last {step['steps_timed']}",
             f"step {_s(step['step_s'])} s = " + ", ".join(
                 f"{name} {_s(sec)} s ({_s(100 * share if share is not None else None, '.0f')}%)"
                 for (name, sec), share in zip(step["phases_s"].items(), step["phases_share"].values(), strict=True))]
    if step["memory_moves_s"]:
        lines.append("memory moves (inside the phases): " + ", ".join(
            f"{k} {_s(v)} s" for k, v in step["memory_moves_s"].items()))
    if step["sub_phases_s"]:
        lines.append("sub-phases: " + ", ".join(f"{k} {_s(v)} s" for k, v in step["sub_phases_s"].items()))
    sync = fig["sync"]
    if sync is None:
        lines.append("no weights_synced event with bytes in events.jsonl")
    else:
        lines.append(f"sync: {_s(sync['gb_per_sync'], '.4g')} GB per sync by {'+'.join(sync['transports']) or '?'}: "
                     f"{_s(sync['seconds'])} s = {_s(sync['s_per_gb'])} s/GB (median of {sync['syncs_timed']})")
        if sync["phases_s"]:
            lines.append("sync phases: " + ", ".join(
                f"{k.removesuffix('_s')} {_s(v, '.4f')} s ({_s(sync['phases_s_per_gb'][k], '.4f')} s/GB)"
                for k, v in sync["phases_s"].items()))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("run_dir", help="a relax train --output-dir")
    ap.add_argument("--warmup", type=int, default=2, help="first steps (and their syncs) left out of the medians")
    ap.add_argument("--json", default=None, help="also write the figures and their provenance here")
    ns = ap.parse_args(argv)
    if ns.warmup < 0:
        ap.error("--warmup must be >= 0")
    try:
        fig = figures(Path(ns.run_dir), ns.warmup)
    except (OSError, ValueError, KeyError) as exc:
        detail = f"missing key {exc}" if isinstance(exc, KeyError) else str(exc)
        print(f"run_figures: {detail}", file=sys.stderr)
        return 2
    print(report(fig))
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"provenance": provenance(), **fig}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
