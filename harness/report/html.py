"""HTML report: per-scenario loss / reward plots (every run overlaid, so parity pairs show as overlays),
throughput per run against the stored baseline band, the check table, and an A/B section when the results
come from ``relax-harness ab``. PNGs are embedded; built from the results JSON alone."""

from __future__ import annotations

import base64
import html
import io
from collections import defaultdict
from pathlib import Path
from typing import Any

from harness.report.terminal import counts_line, outcome, throughput_text

PLOTS = (("train/loss", "loss"), ("train/grad_norm", "grad norm"), ("rollout/reward_mean", "reward"))
COLORS = {"passed": "#1a7f37", "failed": "#cf222e", "unsupported": "#9a6700", "xfailed": "#9a6700",
          "skipped": "#57606a", "xpassed": "#cf222e", "no_baseline": "#8250df"}


NO_MATPLOTLIB = "<p><em>plots need matplotlib (a dev dependency), which this Python lacks</em></p>"


def have_matplotlib() -> bool:
    """The GPU machine's Python has no package index and may lack matplotlib: the report then says so."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png", dpi=80)
    _pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def plot_png(series: dict[str, dict[str, list]]) -> str | None:
    """Base64 PNG with one panel per plotted key, one line per run; None when nothing was logged."""
    if not any(pts for run in series.values() for k, pts in run.items() if k in dict(PLOTS)):
        return None
    plt = _pyplot()
    fig, axes = plt.subplots(1, len(PLOTS), figsize=(4.2 * len(PLOTS), 2.8))
    for ax, (key, title) in zip(axes, PLOTS, strict=True):
        for (run, keys), style in zip(series.items(), ("-", "--", ":", "-."), strict=False):
            pts = [(s, v) for s, v in keys.get(key, []) if v is not None]
            if pts:
                xs, ys = zip(*pts, strict=True)
                ax.plot(xs, ys, style, marker=".", label=run)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        if len(series) > 1 and ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    return _png(fig)


def throughput_points(scenarios: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """baseline key -> {"metric", "machine", "values": this results' runs, "baseline": stored band or None}."""
    out: dict[str, dict[str, Any]] = defaultdict(lambda: {"values": [], "baseline": None})
    for sc in scenarios:
        for c in sc.get("checks", []):
            m = c.get("measurements") or {}
            if c.get("kind") == "throughput" and "value" in m:
                entry = out[m.get("baseline_key") or sc["name"]]
                entry["values"].append(m["value"])
                entry["metric"], entry["machine"] = m.get("metric", ""), sc.get("machine_class", "")
                entry["baseline"] = m.get("baseline") or entry["baseline"]
    return dict(out)


def throughput_png(key: str, point: dict[str, Any]) -> str:
    """This results' runs (numbered) against the stored baseline's runs, median and failing bound."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 2.8))
    base = point["baseline"]
    runs = list(range(1, len(point["values"]) + 1))
    if base:
        stored = base.get("values") or []
        ax.axhspan(base["lower"], max([base["median"], *stored, *point["values"]]) * 1.05, color="#8250df", alpha=0.12,
                   label=f"baseline band (fails below {base['lower']:.4g})")
        ax.axhline(base["median"], color="#8250df", lw=1, label=f"baseline median {base['median']:.4g}")
        if stored:
            ax.plot(range(1, len(stored) + 1), stored, "x", color="#57606a", label="baseline runs")
    lower = base["lower"] if base else float("-inf")
    ok = [(r, v) for r, v in zip(runs, point["values"], strict=True) if v >= lower]
    low = [(r, v) for r, v in zip(runs, point["values"], strict=True) if v < lower]
    for pts, color, label in ((ok, "#0969da", "measured"), (low, "#cf222e", "below the band")):
        if pts:
            ax.plot(*zip(*pts, strict=True), "o", color=color, label=label)
    ax.set_title(f"{key}: {point['metric']} ({point['machine']})" + ("" if base else ", no baseline"), fontsize=9)
    ax.set_xlabel("run", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=6, loc="lower left")
    return _png(fig)


def ab_png(ab: dict[str, Any]) -> str:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(5.5, 2.8))
    for side, color in (("base", "#57606a"), ("candidate", "#0969da")):
        runs = [r for r in ab["runs"] if r["side"] == side]
        ax.plot([r["order"] for r in runs], [r["value"] for r in runs], "o", color=color, label=side)
    ax.set_title(f"A/B {ab['scenario']}: {ab['metric']} per run, in run order", fontsize=9)
    ax.set_xlabel("run order", fontsize=8)
    ax.tick_params(labelsize=7)
    ax.legend(fontsize=7)
    return _png(fig)


def _img(png: str | None, alt: str) -> str:
    return f"<img alt='{html.escape(alt)}' src='data:image/png;base64,{png}'/>" if png else ""


def _plots(sc: dict[str, Any], throughput: dict[str, dict[str, Any]]) -> str:
    key = next((c["measurements"].get("baseline_key") for c in sc.get("checks", [])
                if c.get("kind") == "throughput" and "value" in (c.get("measurements") or {})), None)
    if not have_matplotlib():
        return NO_MATPLOTLIB if key or sc.get("series") else ""
    tput = _img(throughput_png(key, throughput[key]), f"throughput {key}") if key in throughput else ""
    return _img(plot_png(sc.get("series", {})), f"plots {sc['name']}") + tput


def _scenario_html(sc: dict[str, Any], throughput: dict[str, dict[str, Any]]) -> str:
    out = outcome(sc)
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(c['name'])}</td><td style='color:{COLORS.get(c['status'], '#000')}'>{esc(c['status'])}</td>"
        f"<td>{esc(c['message'])}</td></tr>" for c in sc.get("checks", []))
    problems = "".join(f"<li>{esc(p)}</li>" for p in sc.get("problems", []))
    reason = (sc.get("test") or {}).get("reason")
    tline = throughput_text(sc)
    return (f"<section id='{esc(sc['name'])}'><h2>{esc(sc['name'])} "
            f"<span style='color:{COLORS.get(out, '#000')}'>{esc(out.replace('_', ' '))}</span></h2>"
            f"<p>{esc(sc.get('family', ''))} · {esc(sc.get('profile', ''))} · {esc(sc.get('executor', ''))} · "
            f"{sc.get('duration_s', 0):.1f}s — {esc(sc.get('message', ''))}</p>"
            + (f"<p><em>{esc(reason)}</em></p>" if reason else "")
            + (f"<p>throughput: {esc(tline)}</p>" if tline else "")
            + (f"<ul>{problems}</ul>" if problems else "")
            + _plots(sc, throughput)
            + (f"<table><tr><th>check</th><th>status</th><th>message</th></tr>{rows}</table>" if rows else "")
            + "</section>")


def _ab_html(ab: dict[str, Any]) -> str:
    esc = html.escape
    color = COLORS["passed"] if ab["ok"] else COLORS["failed"]
    return (f"<section id='ab'><h2>A/B {esc(ab['scenario'])} <span style='color:{color}'>"
            f"{'PASS' if ab['ok'] else 'FAIL'}</span></h2><p>{esc(ab['verdict'])}</p>"
            f"<p>{esc(ab['statistic'])}</p>{_img(ab_png(ab), 'A/B runs') if have_matplotlib() else NO_MATPLOTLIB}"
            "</section>")


def write_html(results: dict[str, Any], path: str | Path) -> Path:
    scenarios = results.get("scenarios", [])
    throughput = throughput_points(scenarios)
    index = "".join(f"<li><a href='#{html.escape(s['name'])}'>{html.escape(s['name'])}</a> — "
                    f"<span style='color:{COLORS.get(outcome(s), '#000')}'>{outcome(s).replace('_', ' ')}</span></li>"
                    for s in scenarios)
    env = html.escape(", ".join(f"{k}={v}" for k, v in (results.get("environment") or {}).items()))
    body = (_ab_html(results["ab"]) if results.get("ab") else "") + "".join(_scenario_html(s, throughput)
                                                                            for s in scenarios)
    doc = ("<!doctype html><html><head><meta charset='utf-8'><title>relax scenario report</title><style>"
           "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
           "section{border-top:1px solid #ddd;margin-top:1.5em}</style></head><body>"
           f"<h1>relax scenario report</h1><p>{env}</p><p>{html.escape(counts_line(scenarios))}</p>"
           f"<ul>{index}</ul>{body}</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
    return path
