"""Which commit a run came from, for results and baselines that must be traceable."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def source_commit(root: Path = ROOT) -> str | None:
    """``RELAX_COMMIT`` where the caller names it (a tree copied to the GPU machine may carry a stale or no
    ``.git``), else ``root``'s HEAD (12 hex digits), else None."""
    if os.environ.get("RELAX_COMMIT"):
        return os.environ["RELAX_COMMIT"]
    try:
        out = subprocess.run(["git", "-C", str(root), "rev-parse", "--short=12", "HEAD"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout.strip() or None
