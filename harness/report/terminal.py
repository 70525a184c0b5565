"""One-screen terminal summary (rich). Passed, no-baseline and skipped are three different outcomes."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

STYLE = {"passed": "green", "failed": "bold red", "unsupported": "yellow", "xfailed": "yellow",
         "skipped": "dim", "xpassed": "bold red", "no_baseline": "magenta"}


def outcome(sc: dict[str, Any]) -> str:
    """The pytest view when there is one (xfailed is expected), else the scenario status; a scenario that
    passed every judged check but whose throughput has no baseline on this machine class is ``no_baseline``."""
    test = sc.get("test") or {}
    out = test.get("outcome") or sc.get("status", "failed")
    if out == "passed" and any(c.get("status") == "no_baseline" for c in sc.get("checks", [])):
        return "no_baseline"
    return out


def throughput_text(sc: dict[str, Any]) -> str:
    """The throughput column: the figure and its verdict, '' when the scenario measures none."""
    for c in sc.get("checks", []):
        m = c.get("measurements") or {}
        if c.get("kind") != "throughput" or "value" not in m:
            continue
        figure = f"{m['value']:.4g} {m.get('metric', '')}"
        if c.get("status") == "no_baseline":
            return f"{figure}, no baseline for {sc.get('machine_class', '?')}"
        base = m.get("baseline") or {}
        if base.get("median"):
            return f"{figure} ({(m['value'] - base['median']) / base['median']:+.0%} vs baseline)"
        return f"{figure}, {c.get('status')}"
    return ""


def counts_line(scenarios: list[dict[str, Any]]) -> str:
    counts = Counter(outcome(sc) for sc in scenarios)
    return ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in sorted(counts.items())) or "no scenarios ran"


def render_summary(scenarios: list[dict[str, Any]], width: int = 110, color: bool = False) -> str:
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    console = Console(file=buf, width=width, force_terminal=color, color_system="standard" if color else None)
    table = Table(title="relax scenarios", expand=True, show_lines=False)
    table.add_column("scenario", no_wrap=True)
    table.add_column("result", no_wrap=True)
    table.add_column("checks", justify="right", no_wrap=True)
    table.add_column("time", justify="right", no_wrap=True)
    table.add_column("detail", overflow="ellipsis", no_wrap=True, ratio=1)
    for sc in scenarios:
        checks = sc.get("checks", [])
        ok = sum(c.get("status") == "passed" for c in checks)
        out = outcome(sc)
        detail = throughput_text(sc) if out == "no_baseline" else sc.get("message", "")
        reason = (sc.get("test") or {}).get("reason")
        if out == "skipped":
            detail = reason or detail
        elif out == "xfailed" and reason:
            detail = f"{reason} | {detail}" if detail else reason
        table.add_row(sc["name"], f"[{STYLE.get(out, '')}]{out.replace('_', ' ')}[/]", f"{ok}/{len(checks)}",
                      f"{sc.get('duration_s', 0):.1f}s", detail)
    console.print(table)
    console.print(counts_line(scenarios))
    return buf.getvalue()
