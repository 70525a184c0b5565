"""Kernel time by kind, and the GPU's idle time by part of the step, from a chrome trace of one RL step.

    python3 ci/trace_kernels.py TRACE.json[.gz] [--json OUT]

``TRACE`` is what ``ci/bench_megatron.py --profile N --trace TRACE`` writes (torch.profiler's chrome trace). Why:
the profiler's tables sum kernels by name; this groups them by what they do (GEMMs, attention, norms, RoPE,
SwiGLU, strided copies, the rest), so two commits' traces compare at a glance, and splits the step's kernel
timeline at the LM head's forward GEMM, the fused log-prob backward and the optimizer's first multi-tensor
kernel into forward / LM head and loss / backward / optimizer, each with its wall, kernel time and idle time
(idle: the GPU waited on the host there).
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KINDS = (  # first match wins
    ("strided copy", ("direct_copy",)),
    ("norm", ("rsqrt", "_rms_norm_kernel")),
    ("rope", ("cos_mul_neg_sin", "_rope_kernel")),
    ("gemm", ("nvjet", "splitK", "gemm", "cutlass")),
    ("attention", ("cudnn", "fmha", "flash")),
    ("swiglu", ("silu",)),
    ("log-probs", ("_forward_kernel", "_backward_kernel")),
    ("optimizer", ("multi_tensor", "FusedOpti")),
)


def kind(name: str) -> str:
    return next((k for k, marks in KINDS if any(m in name for m in marks)), "other")


def load(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    return sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])


def _segment(kernels: list[dict]) -> dict:
    if not kernels:
        return {"kernels": 0, "wall_ms": 0.0, "kernel_ms": 0.0, "idle_ms": 0.0}
    wall = kernels[-1]["ts"] + kernels[-1]["dur"] - kernels[0]["ts"]
    busy = sum(k["dur"] for k in kernels)
    return {"kernels": len(kernels), "wall_ms": wall / 1e3, "kernel_ms": busy / 1e3, "idle_ms": (wall - busy) / 1e3}


def summarize(kernels: list[dict]) -> dict:
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for k in kernels:
        row = by_kind[kind(k["name"])]
        row[0] += 1
        row[1] += k["dur"] / 1e3
    first = lambda test: next((i for i, k in enumerate(kernels) if test(k)), None)  # noqa: E731
    lm_head = first(lambda k: kind(k["name"]) == "gemm" and k["dur"] > 1000)  # the 32k-vocabulary GEMM
    lp_back = first(lambda k: k["name"] == "_backward_kernel")
    optim = first(lambda k: kind(k["name"]) == "optimizer")
    parts = {}
    if None not in (lm_head, lp_back, optim):
        bounds = {"forward": (0, lm_head), "LM head and loss": (lm_head, lp_back + 1),
                  "backward": (lp_back + 1, optim), "optimizer": (optim, len(kernels))}
        parts = {name: _segment(kernels[a:b]) for name, (a, b) in bounds.items()}
    return {"kernel_ms": sum(k["dur"] for k in kernels) / 1e3, "kernels": len(kernels),
            "by_kind": {k: {"count": int(c), "ms": ms} for k, (c, ms) in sorted(by_kind.items(), key=lambda x: -x[1][1])},
            "parts": parts}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace", type=Path)
    ap.add_argument("--json", default=None, help="also write the summary as JSON to this path")
    ns = ap.parse_args(argv)
    try:
        kernels = load(ns.trace)
    except (OSError, ValueError, KeyError) as exc:
        ap.error(f"cannot read a chrome trace from {ns.trace}: {exc}")
    out = summarize(kernels)
    print(f"{ns.trace}: {out['kernels']} kernels, {out['kernel_ms']:.2f} ms")
    for name, row in out["by_kind"].items():
        print(f"  {name:<14} x{row['count']:<5d} {row['ms']:8.2f} ms")
    for name, seg in out["parts"].items():
        print(f"  {name:<17} wall {seg['wall_ms']:7.2f} ms  kernels {seg['kernel_ms']:7.2f} ms  idle {seg['idle_ms']:7.2f} ms")
    if ns.json:
        from ci.provenance import provenance

        Path(ns.json).write_text(json.dumps({"provenance": provenance(sys.argv), "trace": str(ns.trace), **out},
                                            indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
