"""One-screen terminal summary (rich)."""

from __future__ import annotations

import io
from collections import Counter
from typing import Any

STYLE = {"passed": "green", "failed": "bold red", "unsupported": "yellow", "xfailed": "yellow",
         "skipped": "dim", "xpassed": "bold red"}


def outcome(sc: dict[str, Any]) -> str:
    """The pytest view when there is one (xfailed is expected), else the scenario status."""
    test = sc.get("test") or {}
    return test.get("outcome") or sc.get("status", "failed")


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
        ok = sum(c.get("status") != "failed" for c in checks)
        out = outcome(sc)
        detail = sc.get("message", "")
        reason = (sc.get("test") or {}).get("reason")
        if out == "xfailed" and reason:
            detail = f"{reason} | {detail}"
        table.add_row(sc["name"], f"[{STYLE.get(out, '')}]{out}[/]", f"{ok}/{len(checks)}",
                      f"{sc.get('duration_s', 0):.1f}s", detail)
    console.print(table)
    counts = Counter(outcome(sc) for sc in scenarios)
    console.print(", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no scenarios ran")
    return buf.getvalue()
