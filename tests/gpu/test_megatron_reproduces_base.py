"""The Megatron backend built through the parallel-state code, all sizes 1, reproduces the one-GPU backend bitwise.

"Today's" backend is a checkout of the commit before the parallel code (3f12622, the base of issue
17), named by ``RELAX_MEGATRON_BASE`` (a directory holding its ``relax/`` package, e.g. made with
``git archive 3f12622 relax | tar -x -C DIR``). tests/gpu/megatron_reference_run.py runs the same
configs (plain; distributed optimizer + KL loss + dynamic batching) for 3 steps under that tree and
under this one, each in its own process on the same GPU; this tree runs twice, to show the run is
deterministic at all. Bitwise: every step's log-probs, every metric, and the final weights' checksums.
The one exception is ``train/grad_norm``: it is now megatron-core's global norm (the one it clips
with, over all model-parallel ranks), where the one-GPU backend summed a foreach norm itself; equal to
1e-6 relative (the weights, which the clipping uses, stay bitwise equal).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from relax.backends.megatron.checks import module_available

BASE = os.environ.get("RELAX_MEGATRON_BASE")
SCRIPT = Path(__file__).with_name("megatron_reference_run.py")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
    pytest.mark.skipif(not BASE or not (Path(BASE) / "relax").is_dir(), reason="set RELAX_MEGATRON_BASE to a directory with the base commit's relax/ "
                                        "(git archive 3f12622 relax | tar -x -C DIR; docs/megatron.md)"),
]


def _record(tree: Path, out: Path) -> dict:
    others = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != ROOT]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *others]))
    for name in ("MASTER_ADDR", "MASTER_PORT"):  # each run makes its own world of one
        env.pop(name, None)
    proc = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    record = torch.load(out, weights_only=False)
    assert Path(record["relax"]).resolve().is_relative_to(tree.resolve()), record["relax"]
    return record["configs"]


def _differences(a: dict, b: dict, *, grad_norm_rtol: float) -> list[str]:
    out = []
    for name in a:
        for step, (x, y) in enumerate(zip(a[name]["log_probs"], b[name]["log_probs"], strict=True)):
            if not torch.equal(x, y):
                out.append(f"{name} step {step}: log-probs differ by {float((x - y).abs().max()):.3g}")
        for step, (x, y) in enumerate(zip(a[name]["metrics"], b[name]["metrics"], strict=True)):
            for key in sorted(set(x) | set(y)):
                if key == "train/grad_norm":
                    if abs(x[key] - y[key]) > grad_norm_rtol * abs(x[key]):
                        out.append(f"{name} step {step}: grad_norm {x[key]!r} vs {y[key]!r}")
                elif x.get(key) != y.get(key):
                    out.append(f"{name} step {step}: {key} {x.get(key)!r} vs {y.get(key)!r}")
        if a[name]["checksums"] != b[name]["checksums"]:
            out.append(f"{name}: weights differ in {sum(a[name]['checksums'][k] != v for k, v in b[name]['checksums'].items())} tensors")
    return out


def test_sizes_one_reproduce_the_one_gpu_backend_bitwise(tmp_path: Path) -> None:
    new = _record(ROOT, tmp_path / "new.pt")
    again = _record(ROOT, tmp_path / "again.pt")
    base = _record(Path(BASE), tmp_path / "base.pt")
    deterministic = _differences(new, again, grad_norm_rtol=0.0)
    versus_base = _differences(base, new, grad_norm_rtol=1e-6)
    report = {"deterministic": deterministic, "versus_base": versus_base,
              "loss": {n: [m["train/loss"] for m in r["metrics"]] for n, r in new.items()},
              "grad_norm": {n: [[b["train/grad_norm"], m["train/grad_norm"]] for b, m in zip(base[n]["metrics"],
                                                                                             r["metrics"], strict=True)]
                            for n, r in new.items()}}
    print(f"\n[megatron_reproduces_base] {json.dumps(report)}")
    if os.environ.get("RELAX_GPU_REPORT"):
        Path(os.environ["RELAX_GPU_REPORT"]).mkdir(parents=True, exist_ok=True)
        Path(os.environ["RELAX_GPU_REPORT"], "megatron_reproduces_base.json").write_text(json.dumps(report, indent=1))
    assert not deterministic, deterministic
    assert not versus_base, versus_base
