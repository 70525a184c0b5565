"""ci/trace_kernels.py on a synthetic chrome trace: kinds, parts of the step and their idle time, bad input."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from pathlib import Path

from ci import trace_kernels

ROOT = Path(__file__).resolve().parents[1]


def _trace(path: Path) -> None:
    # (name, start us, duration us): forward (norm, GEMM, gap of 50), LM head GEMM, log-prob backward, backward, Adam
    kernels = [("triton_per_fused__to_copy_add_mean_mul_pow_rsqrt_0", 0, 10), ("nvjet_sm90_tst_x", 60, 100),
               ("nvjet_sm90_big_lm_head", 160, 2000), ("_backward_kernel", 2160, 40),
               ("void at::native::elementwise_kernel<direct_copy_kernel>", 2200, 20), ("cudnn_flash_bprop", 2220, 30),
               ("multi_tensor_apply_kernel<FusedOptimizer>", 2300, 5), ("FillFunctor", 2305, 1)]
    events = [{"cat": "kernel", "name": n, "ts": ts, "dur": d} for n, ts, d in kernels]
    events.append({"cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5})
    with gzip.open(path, "wt") as f:
        json.dump({"traceEvents": events}, f)


def test_kinds_and_parts(tmp_path: Path) -> None:
    path = tmp_path / "t.json.gz"
    _trace(path)
    out = trace_kernels.summarize(trace_kernels.load(path))
    assert out["kernels"] == 8 and abs(out["kernel_ms"] - 2.206) < 1e-9
    kinds = {k: v["count"] for k, v in out["by_kind"].items()}
    assert kinds == {"gemm": 2, "log-probs": 1, "attention": 1, "strided copy": 1, "norm": 1, "optimizer": 1,
                     "other": 1}
    forward = out["parts"]["forward"]
    assert forward["kernels"] == 2 and abs(forward["idle_ms"] - 0.05) < 1e-9  # the 50 us gap before the GEMM
    assert out["parts"]["LM head and loss"]["kernels"] == 2 and out["parts"]["optimizer"]["kernels"] == 2
    assert abs(out["parts"]["backward"]["idle_ms"]) < 1e-9


def test_json_and_a_bad_file(tmp_path: Path) -> None:
    path, dest = tmp_path / "t.json.gz", tmp_path / "out.json"
    _trace(path)
    ok = subprocess.run([sys.executable, "ci/trace_kernels.py", str(path), "--json", str(dest)], cwd=ROOT,
                        capture_output=True, text=True)
    assert ok.returncode == 0 and "8 kernels" in ok.stdout, ok.stderr
    data = json.loads(dest.read_text())
    assert data["provenance"]["command"] and data["by_kind"]["gemm"]["count"] == 2
    (tmp_path / "bad.json").write_text("not json")
    bad = subprocess.run([sys.executable, "ci/trace_kernels.py", str(tmp_path / "bad.json")], cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "cannot read a chrome trace" in bad.stderr.strip().splitlines()[-1]
