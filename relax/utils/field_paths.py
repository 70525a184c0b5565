"""A pydantic error's location as the file spells it (``eval.datasets[0].path``), for one-line config errors."""

from __future__ import annotations


def field_path(loc: tuple) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "(top level)"
