"""Run a test script under Triton's CPU interpreter and read back its result.

The interpreter is chosen when ``triton.jit`` decorates, so the script runs in a fresh process with
``TRITON_INTERPRET=1``; it prints one ``RESULT <json>`` line, which this returns decoded.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed (dev extra)")


def run_interpreted(script: str) -> Any:
    """``script`` (given the repo root as ``sys.argv[1]``) under ``TRITON_INTERPRET=1``; its ``RESULT`` JSON."""
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", script, str(ROOT)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[0][len("RESULT "):])


def refusal(call) -> str:
    """The message of the ``ValueError`` that ``call()`` raises (what a kernel's launcher says to a shape it does not
    take), or a line saying none came; for the interpreted scripts' JSON."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return "no ValueError raised"
