"""HTML report: per-scenario loss / reward / throughput plots (every run overlaid, so parity pairs
show as overlays) and the check table, PNGs embedded. Built from the results JSON alone."""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path
from typing import Any

from harness.report.terminal import outcome

PLOTS = (("train/loss", "loss"), ("rollout/reward_mean", "reward"), ("perf/tokens_per_s", "tokens/s"))
COLORS = {"passed": "#1a7f37", "failed": "#cf222e", "unsupported": "#9a6700", "xfailed": "#9a6700",
          "skipped": "#57606a", "xpassed": "#cf222e"}


def plot_png(series: dict[str, dict[str, list]]) -> str | None:
    """Base64 PNG with one panel per plotted key, one line per run; None when nothing was logged."""
    if not any(pts for run in series.values() for k, pts in run.items() if k in dict(PLOTS)):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

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
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=80)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def _scenario_html(sc: dict[str, Any]) -> str:
    out = outcome(sc)
    esc = html.escape
    rows = "".join(
        f"<tr><td>{esc(c['name'])}</td><td style='color:{COLORS.get(c['status'], '#000')}'>{esc(c['status'])}</td>"
        f"<td>{esc(c['message'])}</td></tr>" for c in sc.get("checks", []))
    problems = "".join(f"<li>{esc(p)}</li>" for p in sc.get("problems", []))
    png = plot_png(sc.get("series", {}))
    img = f"<img alt='plots {esc(sc['name'])}' src='data:image/png;base64,{png}'/>" if png else ""
    reason = (sc.get("test") or {}).get("reason")
    return (f"<section id='{esc(sc['name'])}'><h2>{esc(sc['name'])} "
            f"<span style='color:{COLORS.get(out, '#000')}'>{esc(out)}</span></h2>"
            f"<p>{esc(sc.get('family', ''))} · {esc(sc.get('profile', ''))} · {esc(sc.get('executor', ''))} · "
            f"{sc.get('duration_s', 0):.1f}s — {esc(sc.get('message', ''))}</p>"
            + (f"<p><em>{esc(reason)}</em></p>" if reason else "")
            + (f"<ul>{problems}</ul>" if problems else "")
            + img + (f"<table><tr><th>check</th><th>status</th><th>message</th></tr>{rows}</table>" if rows else "")
            + "</section>")


def write_html(results: dict[str, Any], path: str | Path) -> Path:
    scenarios = results.get("scenarios", [])
    index = "".join(f"<li><a href='#{html.escape(s['name'])}'>{html.escape(s['name'])}</a> — "
                    f"<span style='color:{COLORS.get(outcome(s), '#000')}'>{outcome(s)}</span></li>"
                    for s in scenarios)
    env = html.escape(", ".join(f"{k}={v}" for k, v in (results.get("environment") or {}).items()))
    body = "".join(_scenario_html(s) for s in scenarios)
    doc = ("<!doctype html><html><head><meta charset='utf-8'><title>relax scenario report</title><style>"
           "body{font-family:sans-serif;margin:2em;max-width:1400px}table{border-collapse:collapse}"
           "td,th{border:1px solid #ccc;padding:3px 8px;font-size:13px;text-align:left}"
           "section{border-top:1px solid #ddd;margin-top:1.5em}</style></head><body>"
           f"<h1>relax scenario report</h1><p>{env}</p><ul>{index}</ul>{body}</body></html>")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc)
    return path
