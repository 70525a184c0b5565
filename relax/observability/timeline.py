"""``--timeline-dump-dir DIR``: the run as one Chrome trace (``DIR/timeline.json``, the ``traceEvents`` format that
chrome://tracing and https://ui.perfetto.dev open), one row per actor: the driver, each trainer rank, each
engine, the fully-async services, and the reward scoring.

Built at the run's end from what the run records anyway (events.jsonl: steps, phases, weight syncs,
offloads, checkpoints, faults) plus the spans events.jsonl lacks, recorded while the run goes
(relax/observability/spans.py): the rollout's generation and reward scoring, and each step's log-prob
forwards and optimizer updates on trainer rank 0.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from relax.observability.config import TimelineConfig
from relax.observability.run_files import RunFiles, load_run
from relax.observability.spans import RECORDER

TRACE_FILE = "timeline.json"
FAULTS = ("fault_detected", "restart", "abort", "engine_dropped")


def start_timeline(cfg: TimelineConfig) -> None:
    """Turn on this (the driver's) process's span recorder; the trainer ranks turn on their own."""
    RECORDER.enabled = cfg.enabled


def write_timeline(cfg: TimelineConfig) -> Path | None:
    """Write ``DIR/timeline.json`` from the run directory and the recorded spans (the run's end, whatever it was)."""
    if not cfg.enabled:
        return None
    trace = build_trace(load_run(cfg.output_dir), RECORDER.drain())
    out = Path(cfg.timeline_dump_dir) / TRACE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(trace))
    return out


class _Trace:
    def __init__(self, t0: float):
        self.t0, self.rows, self.events = t0, {}, []

    def row(self, name: str) -> int:
        if name not in self.rows:
            pid = self.rows[name] = len(self.rows)
            self.events += [{"ph": "M", "name": "process_name", "pid": pid, "tid": pid, "args": {"name": name}},
                            {"ph": "M", "name": "thread_name", "pid": pid, "tid": pid, "args": {"name": name}},
                            {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": pid,
                             "args": {"sort_index": pid}}]
        return self.rows[name]

    def span(self, row: str, name: str, start: float, end: float, cat: str = "relax", **fields: Any) -> None:
        pid = self.row(row)
        self.events.append({"ph": "X", "name": name, "cat": cat, "pid": pid, "tid": pid,
                            "ts": (start - self.t0) * 1e6, "dur": max(end - start, 0.0) * 1e6, "args": fields})

    def instant(self, row: str, name: str, at: float, **fields: Any) -> None:
        pid = self.row(row)
        self.events.append({"ph": "i", "s": "p", "name": name, "cat": "fault", "pid": pid, "tid": pid,
                            "ts": (at - self.t0) * 1e6, "args": fields})


def _actors(run: RunFiles) -> list[str]:
    roles = []
    for e in run.events:
        role = e.get("role")
        if e.get("event") == "process_started" and role and role not in roles:
            roles.append(role)
    return sorted(roles, key=lambda r: (not r.startswith("trainer"), not r.startswith("engine"), r))


def _phase_spans(run: RunFiles) -> list[tuple[str, float, float, int]]:
    """(phase, start, end, step) of the driver loop's phases; a fully-async run's rollout (the producer's, which
    overlaps the loop) comes from the recorded spans instead."""
    fully_async = bool(run.config.get("fully_async"))
    loop = [e for e in run.events if e.get("event") in ("step_start", "step_end", "checkpoint_saved")
            or (e.get("event") == "phase" and not (fully_async and e.get("phase") == "rollout"))]
    spans = []
    for cur, nxt in zip(loop, loop[1:], strict=False):
        if cur["event"] == "phase":
            spans.append((cur["phase"], cur["time"], nxt["time"], cur.get("step", -1)))
    return spans


def build_trace(run: RunFiles, recorded: list[dict[str, Any]]) -> dict[str, Any]:
    t0 = run.start_time or min((s["start"] for s in recorded), default=0.0)
    trace = _Trace(t0)
    actors = _actors(run)
    trainers = [a for a in actors if a.startswith("trainer")]
    engines = [a for a in actors if a.startswith("engine")]
    for row in ["driver", *actors]:
        trace.row(row)
    starts = {e["step"]: e["time"] for e in run.events if e.get("event") == "step_start"}
    for e in run.events:
        if e.get("event") == "step_end" and e.get("step") in starts:
            trace.span("driver", f"step {e['step']}", starts[e["step"]], e["time"], step=e["step"])
    for phase, start, end, step in _phase_spans(run):
        trace.span("driver", phase, start, end, step=step)
        if phase == "train":
            for rank in trainers:
                trace.span(rank, "train", start, end, step=step)
        if phase == "checkpoint" and trainers:
            trace.span(trainers[0], "checkpoint", start, end, step=step)
    for e in run.events:
        _event_spans(trace, e, trainers)
    for span in recorded:
        rows = engines if span["row"] == "engines" else [span["row"]]
        fields = {k: v for k, v in span.items() if k not in ("name", "row", "start", "end")}
        for row in rows or ["engines"]:
            trace.span(row, span["name"], span["start"], span["end"], **fields)
    return {"traceEvents": trace.events, "displayTimeUnit": "ms",
            "otherData": {"run_dir": str(run.directory), "t0_unix": t0, "rows": list(trace.rows)}}


def _event_spans(trace: _Trace, e: dict[str, Any], trainers: list[str]) -> None:
    kind, at = e.get("event"), e.get("time", 0.0)
    seconds = float(e.get("seconds") or 0.0)
    if kind == "weights_synced":
        fields = {k: e.get(k) for k in ("version", "bytes", "prepare_s", "transfer_s", "checksums_s") if k in e}
        for row in [*trainers[:1], *(f"engine:{i}" for i in e.get("engines") or []), *(e.get("services") or [])]:
            trace.span(row, "sync", at - seconds, at, **fields)
        if e.get("step", 0) == 0 and e.get("version", 0) == 0:
            trace.span("driver", "sync", at - seconds, at, version=0)  # the initial push, before step 0
    elif kind in ("trainer_offload", "trainer_onload"):
        name = "offload" if kind == "trainer_offload" else "onload"
        for rank in trainers:
            trace.span(rank, name, at - seconds, at, step=e.get("step"), device_bytes=e.get("device_bytes"))
    elif kind in ("engine_release", "engine_resume"):
        name = "offload" if kind == "engine_release" else "onload"
        trace.span(str(e.get("role")), name, at - seconds, at, step=e.get("step"), device_bytes=e.get("device_bytes"))
    elif kind in FAULTS:
        role = str(e.get("role") or "driver")
        trace.instant(role if role.startswith(("engine", "trainer")) else "driver", kind, at,
                      **{k: v for k, v in e.items() if k not in ("time", "event")})


def main(argv: list[str]) -> int:
    """``python -m relax.observability.timeline RUN_DIR OUT_DIR``: rebuild a finished run's trace (without the
    recorded spans, which live only in the run's own dump)."""
    run_dir, out_dir = argv
    cfg = TimelineConfig(timeline_dump_dir=out_dir, output_dir=run_dir)
    out = Path(out_dir) / TRACE_FILE
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(build_trace(load_run(cfg.output_dir), [])))
    print(out)
    return 0


if __name__ == "__main__":
    import sys

    raise SystemExit(main(sys.argv[1:]))
