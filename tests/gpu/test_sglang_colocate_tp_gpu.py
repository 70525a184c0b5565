"""``--colocate`` with an SGLang engine of two GPUs, through ``relax train`` (ci/sglang_runs.py colocate-tp2): Megatron
at TP 2 and one ``--tp-size 2`` server share both GPUs; every sync goes by CUDA IPC and every version is equal on both
of the server's ranks, read back through SGLang's own per-rank ``/weights_checker`` hashes (layout ``sglang-tp2``).
Needs two GPUs and SGLang 0.5.14 at ``RELAX_SGLANG_PYTHONPATH`` (ci/wheelhouse/install_sglang.sh: /tmp/sglsite)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(os.environ.get("RELAX_SGLANG_PYTHONPATH", "/tmp/sglsite"))

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu, pytest.mark.sglang,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs"),
              pytest.mark.skipif(not (SITE / "sglang" / "__init__.py").is_file(),
                                 reason=f"needs SGLang 0.5.14 at {SITE} (RELAX_SGLANG_PYTHONPATH)")]


def test_a_two_gpu_engine_colocated_with_megatron_tp2_gets_every_version_on_both_ranks(tmp_path: Path) -> None:
    out = tmp_path / "run.json"
    proc = subprocess.run([sys.executable, "ci/sglang_runs.py", "colocate-tp2", "--steps", "3", "--timeout", "400",
                           "--workdir", str(tmp_path / "runs"), "--json", str(out)], cwd=ROOT, capture_output=True,
                          text=True, timeout=480, env={**os.environ, "RELAX_SGLANG_PYTHONPATH": str(SITE)})
    assert out.exists(), proc.stdout[-3000:] + proc.stderr[-3000:]
    (row,) = json.loads(out.read_text())["rows"]
    assert row["rc"] == 0, row["log_tail"]
    assert row["steps"] == 3 and row["syncs"] == 4 and row["transports"] == ["tensor"]
    assert row["weights"]["status"] == "passed" and row["weights"]["layouts"] == ["sglang-tp2"], row["weights"]
