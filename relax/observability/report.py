"""``relax report RUN_DIR [--out FILE]``: one self-contained HTML page of what a run did.

The page holds plotly.js inline (it opens offline) and one figure per panel: reward, the loss terms,
response length, where each step's time went, weight-sync speed, the trainer/rollout log-prob mismatch,
staleness, the run's events and faults on one time axis, and the run's status and config. Each figure's
JSON sits in a ``<script type="application/json" data-panel=ID>`` tag, so a test (or a script) can read
the plotted data back. A panel whose data the run does not have says so in one line instead.
"""

from __future__ import annotations

import argparse
import html
import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax.observability.run_files import RunDirError, RunFiles, as_float, load_run

EXIT_USAGE = 2


@dataclass
class Panel:
    id: str
    title: str
    figure: Any = None  # a plotly Figure, or None with ``missing`` saying why
    missing: str = ""


def _figure(title: str, *, x_title: str = "step", y_title: str = ""):
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.update_layout(title=title, xaxis_title=x_title, yaxis_title=y_title, height=360,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50}, legend={"orientation": "h", "y": -0.25})
    return fig


def _lines(run: RunFiles, pid: str, title: str, keys: list[tuple[str, str]], y_title: str = "") -> Panel:
    """One line per metric the run logged; missing when it logged none of them."""
    import plotly.graph_objects as go

    present = [(key, label) for key, label in keys if run.has(key)]
    if not present:
        return Panel(pid, title, missing=f"this run logged none of {', '.join(k for k, _ in keys)}")
    fig = _figure(title, y_title=y_title)
    for key, label in present:
        xs, ys = run.series(key)
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=label))
    return Panel(pid, title, fig)


def reward_panel(run: RunFiles) -> Panel:
    import plotly.graph_objects as go

    title = "Reward: mean and spread (±1 std over the step's samples)"
    xs, mean = run.series("rollout/reward_mean")
    if not xs:
        return Panel("reward", title, missing="this run logged no rollout/reward_mean")
    std = dict(zip(*run.series("rollout/reward_std"), strict=True))
    fig = _figure(title, y_title="reward")
    if std:
        upper = [m + std.get(x, 0.0) for x, m in zip(xs, mean, strict=True)]
        lower = [m - std.get(x, 0.0) for x, m in zip(xs, mean, strict=True)]
        fig.add_trace(go.Scatter(x=xs + xs[::-1], y=upper + lower[::-1], fill="toself", name="±1 std",
                                 line={"width": 0}, fillcolor="rgba(31,119,180,0.2)", hoverinfo="skip"))
    fig.add_trace(go.Scatter(x=xs, y=mean, mode="lines+markers", name="reward mean", line={"color": "#1f77b4"}))
    return Panel("reward", title, fig)


def loss_panel(run: RunFiles) -> Panel:
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    title = "Loss, KL, grad norm, entropy"
    rows = [("loss", ["train/loss", "train/pg_loss"]), ("KL", ["train/ppo_kl", "train/kl_loss"]),
            ("grad norm", ["train/grad_norm"]), ("entropy", ["train/entropy"])]
    rows = [(name, [k for k in keys if run.has(k)]) for name, keys in rows]
    rows = [(name, keys) for name, keys in rows if keys]
    if not rows:
        return Panel("loss", title, missing="this run logged no train/* loss metrics (a --debug-rollout-only run?)")
    fig = make_subplots(rows=len(rows), cols=1, shared_xaxes=True, subplot_titles=[n for n, _ in rows],
                        vertical_spacing=0.06)
    for i, (_, keys) in enumerate(rows, start=1):
        for key in keys:
            xs, ys = run.series(key)
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines+markers", name=key), row=i, col=1)
    fig.update_layout(title=title, height=220 * len(rows) + 80, margin={"l": 60, "r": 20, "t": 60, "b": 40})
    fig.update_xaxes(title_text="step", row=len(rows), col=1)
    return Panel("loss", title, fig)


PHASES = [("perf/eval_time_s", "eval"), ("perf/rollout_wait_s", "wait for rollout (fully-async)"),
          ("perf/rollout_time_s", "rollout"), ("perf/services_time_s", "services"), ("perf/train_time_s", "train"),
          ("perf/sync_time_s", "weight sync")]


def step_time_panel(run: RunFiles) -> Panel:
    """The step's phases stacked; what the step took beyond them is ``other`` (checkpoint, bookkeeping).
    In a fully-async run the rollout overlaps training, so it is drawn as a line, not stacked."""
    import plotly.graph_objects as go

    title = "Step time by phase (s)"
    fully_async = bool(run.config.get("fully_async"))
    phases = [(k, label) for k, label in PHASES if run.has(k)]
    if not phases:
        return Panel("step_time", title, missing="this run logged no perf/*_time_s metrics")
    fig = _figure(title, y_title="seconds")
    stacked: dict[int, float] = {}
    for key, label in phases:
        xs, ys = run.series(key)
        if fully_async and key == "perf/rollout_time_s":
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", name="rollout (producer, overlaps)",
                                     line={"dash": "dot"}))
            continue
        fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", stackgroup="phases", name=label))
        for x, y in zip(xs, ys, strict=True):
            stacked[x] = stacked.get(x, 0.0) + (y if y == y else 0.0)
    xs, total = run.series("perf/step_time_s")
    if xs:
        fig.add_trace(go.Scatter(x=xs, y=[max(t - stacked.get(x, 0.0), 0.0) for x, t in zip(xs, total, strict=True)],
                                 mode="lines", stackgroup="phases", name="other"))
    return Panel("step_time", title, fig)


def weight_sync_panel(run: RunFiles) -> Panel:
    import plotly.graph_objects as go

    title = "Weight sync: seconds per GB sent to each target"
    syncs = [e for e in run.events if e.get("event") == "weights_synced" and as_float(e.get("bytes"))]
    if not syncs:
        return Panel("weight_sync", title, missing="this run has no weights_synced events (no engines to sync)")
    fig = _figure(title, x_title="weight version", y_title="s/GB")
    versions = [int(e.get("version", i)) for i, e in enumerate(syncs)]
    fig.add_trace(go.Scatter(x=versions, y=[e["seconds"] / (e["bytes"] / 1e9) for e in syncs],
                             mode="lines+markers", name="total s/GB"))
    for part in ("prepare_s", "transfer_s", "checksums_s"):
        if all(part in e for e in syncs):
            fig.add_trace(go.Scatter(x=versions, y=[e[part] / (e["bytes"] / 1e9) for e in syncs], mode="lines",
                                     name=part.removesuffix("_s") + " s/GB", line={"dash": "dot"}))
    return Panel("weight_sync", title, fig)


def staleness_panel(run: RunFiles) -> Panel:
    title = "Staleness (steps between the weights that generated a sample and the step training it)"
    if not run.config.get("fully_async"):
        return Panel("staleness", title, missing="not a --fully-async run: every sample is generated by the "
                                                 "weights that train it (staleness 0)")
    return _lines(run, "staleness", title, [("rollout/staleness_mean", "mean"), ("rollout/staleness_max", "max"),
                                            ("rollout/token_staleness_max", "token max")], "steps")


FAULTS = {"fault_detected", "restart", "abort", "run_end"}
ROW_OF = {"trainer_offload": "trainer", "trainer_onload": "trainer"}


def events_panel(run: RunFiles) -> Panel:
    """The driver's phases as bars and every event as a marker, one row per role, seconds since the start."""
    import plotly.graph_objects as go

    title = "Engine events and faults over time (s since start)"
    t0 = run.start_time
    if not run.events or t0 is None:
        return Panel("events", title, missing="this run has no events.jsonl")
    fig = _figure(title, x_title="seconds since the run started")
    phases = [e for e in run.events if e.get("event") in ("phase", "step_end")]
    bars: dict[str, list[tuple[float, float, int]]] = {}
    for cur, nxt in zip(phases, phases[1:], strict=False):
        if cur["event"] == "phase":
            bars.setdefault(cur["phase"], []).append((cur["time"] - t0, nxt["time"] - cur["time"], cur.get("step", -1)))
    for phase, spans in bars.items():
        fig.add_trace(go.Bar(base=[s for s, _, _ in spans], x=[d for _, d, _ in spans], y=["driver"] * len(spans),
                             orientation="h", name=f"phase {phase}", customdata=[st for _, _, st in spans],
                             hovertemplate="step %{customdata}: %{x:.3f}s"))
    kinds: dict[str, list[dict]] = {}
    for e in run.events:
        if e.get("event") not in ("phase", "step_start", "step_end"):
            kinds.setdefault(e["event"], []).append(e)
    for kind, evs in kinds.items():
        fault = kind in FAULTS and kind != "run_end"
        fig.add_trace(go.Scatter(
            x=[e["time"] - t0 for e in evs], y=[str(e.get("role") or ROW_OF.get(kind, "driver")) for e in evs],
            mode="markers", name=kind, text=[_event_text(e) for e in evs], hoverinfo="text+x",
            marker={"symbol": "x" if fault else "circle", "size": 12 if fault else 8,
                    **({"color": "red"} if fault else {})}))
    fig.update_layout(barmode="overlay", height=420)
    return Panel("events", title, fig)


def _event_text(event: dict[str, Any]) -> str:
    fields = {k: v for k, v in event.items() if k not in ("time", "event", "argv", "groups", "node_id")}
    return f"{event['event']} " + ", ".join(f"{k}={v}" for k, v in fields.items())[:300]


def build_panels(run: RunFiles) -> list[Panel]:
    return [
        reward_panel(run),
        loss_panel(run),
        _lines(run, "response_length", "Response length (tokens, mean over the step's samples)",
               [("rollout/response_len_mean", "response length")], "tokens"),
        step_time_panel(run),
        weight_sync_panel(run),
        _lines(run, "logprob_mismatch", "Trainer vs rollout log-probs (same tokens)",
               [("train/train_rollout_logprob_abs_diff", "mean |diff|"),
                ("train/train_rollout_logprob_abs_diff_p99", "p99 |diff|"),
                ("train/train_rollout_logprob_abs_diff_max", "max |diff|"),
                ("train/train_rollout_kl", "KL(rollout || trainer)")]),
        staleness_panel(run),
        events_panel(run),
    ]


def _status_html(run: RunFiles) -> str:
    info = run.run_info
    if not info:
        return "<p class=missing>this run has no run.json (still starting, or killed before writing it)</p>"
    start, end = info.get("start_time"), info.get("end_time")
    rows = [("status", info.get("status")), ("exit code", info.get("exit_code")), ("error", info.get("error")),
            ("device", info.get("device")), ("dtypes", info.get("dtypes")), ("seeds", info.get("seeds")),
            ("started", time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start)) if start else None),
            ("duration", f"{end - start:.1f} s" if start and end else "still running or killed"),
            ("steps logged", len(run.steps)), ("versions", info.get("versions"))]
    return _table(rows, "status")


def _config_html(run: RunFiles) -> str:
    from relax.utils.flag_table import FLAGS

    config = run.config
    if not config:
        return "<p class=missing>run.json holds no config</p>"
    defaults = {spec.dest: spec.default for spec in FLAGS}
    changed = [(f"--{k.replace('_', '-')}", v) for k, v in config.items() if k in defaults and v != defaults[k]]
    other = [(k, v) for k, v in config.items() if k not in defaults and k != "notices"]
    notices = "".join(f"<li>{html.escape(str(n))}</li>" for n in config.get("notices") or [])
    return ((f"<h3>Notices</h3><ul>{notices}</ul>" if notices else "")
            + "<h3>Flags that differ from their defaults</h3>" + _table(changed, "config-changed")
            + "<details><summary>Every flag</summary>"
            + _table([(f"--{k.replace('_', '-')}", v) for k, v in config.items() if k in defaults], "config-all")
            + "</details>" + ("<details><summary>Resolved at start</summary>" + _table(other, "config-resolved")
                              + "</details>" if other else ""))


def _table(rows: list[tuple[str, Any]], table_id: str) -> str:
    body = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_show(v))}</td></tr>" for k, v in rows)
    return f"<table id={table_id}>{body}</table>"


def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


PAGE_CSS = """body{font-family:system-ui,sans-serif;margin:24px;max-width:1200px}
.missing{color:#777;font-style:italic} table{border-collapse:collapse;font-size:13px}
th,td{border:1px solid #ddd;padding:3px 8px;text-align:left;vertical-align:top} th{background:#f6f6f6}
section{margin-bottom:28px} td{word-break:break-all}"""

RENDER_JS = """document.querySelectorAll('script[data-panel]').forEach(function (s) {
  var fig = JSON.parse(s.textContent);
  Plotly.newPlot('plot-' + s.dataset.panel, fig.data, fig.layout, {responsive: true});
});"""


def render_html(run: RunFiles) -> str:
    from plotly.offline import get_plotlyjs

    sections = []
    for panel in build_panels(run):
        if panel.figure is None:
            body = f"<p class=missing id=missing-{panel.id}>{html.escape(panel.title)}: {html.escape(panel.missing)}</p>"
        else:
            data = panel.figure.to_json().replace("</", "<\\/")  # the JSON cannot end its script tag
            body = (f"<div id=plot-{panel.id}></div>"
                    f"<script type=application/json data-panel={panel.id}>{data}</script>")
        sections.append(f"<section>{body}</section>")
    status = run.run_info.get("status", "unknown")
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>relax report: {html.escape(str(run.directory))}"
            f"</title><style>{PAGE_CSS}</style><script>{get_plotlyjs()}</script></head><body>"
            f"<h1>Run {html.escape(str(run.directory))}</h1><p>status <b>{html.escape(str(status))}</b>, "
            f"{len(run.steps)} step(s) logged</p>"
            + (f"<p class=missing id=unreadable>{html.escape(unreadable_line(run))}</p>" if run.unreadable else "")
            + "".join(sections)
            + f"<section><h2>Run status (run.json)</h2>{_status_html(run)}</section>"
            + f"<section><h2>Config</h2>{_config_html(run)}</section>"
            + f"<script>{RENDER_JS}</script></body></html>")


def unreadable_line(run: RunFiles) -> str:
    """One line naming the skipped lines (the first five of them)."""
    shown = ", ".join(run.unreadable[:5]) + (f" and {len(run.unreadable) - 5} more" if len(run.unreadable) > 5 else "")
    return f"skipped {len(run.unreadable)} line(s) that are not JSON objects: {shown}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="relax report", description="one self-contained HTML page of a run")
    parser.add_argument("run_dir", metavar="RUN_DIR", help="a run's --output-dir")
    parser.add_argument("--out", metavar="FILE", help="where to write the page (default RUN_DIR/report.html)")
    opts = parser.parse_args(argv)
    try:
        run = load_run(opts.run_dir)
    except RunDirError as exc:
        print(f"relax report: {exc}", file=sys.stderr)
        return EXIT_USAGE
    if run.unreadable:
        print(f"relax report: {unreadable_line(run)}", file=sys.stderr)
    out = Path(opts.out) if opts.out else run.directory / "report.html"
    page = render_html(run)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(page, encoding="utf-8")
    except OSError as exc:
        print(f"relax report: cannot write {out}: {exc.strerror or exc}", file=sys.stderr)
        return EXIT_USAGE
    print(f"relax report: wrote {out} ({len(page) / 2**20:.1f} MiB, opens offline)")
    return 0
