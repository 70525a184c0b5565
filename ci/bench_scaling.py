"""Data-parallel scaling of ``relax train``: ci/bench_grpo_e2e.py's GRPO workload on 1, 2, ... GPUs, one run each.

    python3 ci/bench_scaling.py --gpus 1 2 4 --json /tmp/out/scaling.json      # GPU machine with 4 GPUs
    python3 ci/bench_scaling.py --gpus 1 2 --backend torch --json /tmp/out/scaling.json
    python3 ci/bench_scaling.py --device cpu --model tiny-qwen3 --prompt-len 8 --max-new 8 --prompts 2 \\
        --generations 4 --relax-steps 3 --warmup 1 --gpus 1 2 --backend torch   # CPU smoke (numbers mean nothing)

Weak scaling, as a user adds GPUs to get more samples per step: on N GPUs the step has N x ``--prompts`` prompts
(x ``--generations`` completions), the trainer is data parallel over the N GPUs and there is one engine per GPU,
colocated (``--colocate --resource '{"actor": [1, N], "rollout": [1, N]}'``). The workload per GPU, the model,
the reward and the optimizer are bench_grpo_e2e's (its docstring); so is how a row is timed: the median
``perf/step_time_s`` after ``--warmup`` steps. samples/s = completions per step / median step time; the
speedup column is against the previous (smaller) row. Target: the largest row's samples/s >= 1.8 x ... of half
its GPUs (issue 38: 4 GPUs >= 1.8x 2 GPUs), reported, not a failure.

Exit status 0 when every row ran, 1 when one failed, 2 when the machine has fewer GPUs than ``--gpus`` asks.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci.bench_grpo_e2e import build_parser, log, run_relax, write_prompts  # noqa: E402
from ci.provenance import write_result  # noqa: E402

SCALING_TARGET = 1.8  # samples/s of 2k GPUs over k GPUs


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    ap.description = __doc__.split("\n\n")[0]
    ap.add_argument("--gpus", nargs="+", type=int, default=[1, 2], help="GPU counts, one run each (ascending)")
    ap.add_argument("--backend", default="megatron", choices=["megatron", "torch"], help="--train-backend")
    ns = ap.parse_args(argv)
    ns.steps = ns.steps or 8
    ns.relax_steps = ns.relax_steps or 10
    if sorted(ns.gpus) != ns.gpus or min(ns.gpus) < 1:
        ap.error(f"--gpus must be ascending counts >= 1, got {ns.gpus}")
    return ns


def run_row(ns: argparse.Namespace, gpus: int, workdir: Path) -> dict:
    """One ``relax train`` on ``gpus`` GPUs, with ``gpus`` x ``--prompts`` prompts per step."""
    row_ns = copy.copy(ns)
    row_ns.prompts = ns.prompts * gpus
    workdir.mkdir(parents=True, exist_ok=True)
    prompts = write_prompts(row_ns, workdir)
    layout = json.dumps({"actor": [1, gpus], "rollout": [1, gpus]})
    result = run_relax(row_ns, ns.backend, prompts, workdir, name=f"relax-{ns.backend}-{gpus}gpu",
                       mode=("--colocate", "--resource", layout))
    step = result.median_step_s
    return {"gpus": gpus, "system": result.system, "status": result.status, "note": result.note,
            "completions_per_step": row_ns.prompts * ns.generations, "median_step_s": step,
            "samples_per_s": row_ns.prompts * ns.generations / step if step else None,
            "tokens_per_s": result.tokens_per_s, "step_s": result.step_s, "rollout_s": result.rollout_s,
            "train_s": result.train_s, "sync_s": result.sync_s}


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    if ns.device == "cuda":
        import torch

        if torch.cuda.device_count() < max(ns.gpus):
            print(f"bench_scaling: --gpus {max(ns.gpus)} asks for more GPUs than this machine has "
                  f"({torch.cuda.device_count()})", file=sys.stderr)
            return 2
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_scaling_") as tmp:
        workdir = Path(ns.workdir or tmp).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        rows = []
        for gpus in ns.gpus:
            log(f"{gpus} GPU(s): {ns.prompts * gpus} prompts x {ns.generations} per step")
            rows.append(run_row(ns, gpus, workdir / f"{gpus}gpu"))
    previous = None
    print(f"{'GPUs':>4}  {'completions/step':>16}  {'median step s':>13}  {'samples/s':>9}  {'vs previous':>11}  status")
    for row in rows:
        base = previous["samples_per_s"] if previous and previous["samples_per_s"] else None
        row["speedup_vs_previous"] = row["samples_per_s"] / base if base and row["samples_per_s"] else None
        step = f"{row['median_step_s']:.3f}" if row["median_step_s"] else "-"
        rate = f"{row['samples_per_s']:.1f}" if row["samples_per_s"] else "-"
        ratio = f"{row['speedup_vs_previous']:.2f}x" if row["speedup_vs_previous"] else "-"
        print(f"{row['gpus']:>4}  {row['completions_per_step']:>16}  {step:>13}  {rate:>9}  {ratio:>11}  "
              f"{row['status']} {row['note']}")
        previous = row
    by_gpus = {r["gpus"]: r for r in rows if r["samples_per_s"]}
    checks = [{"gpus": g, "over": g // 2, "ratio": by_gpus[g]["samples_per_s"] / by_gpus[g // 2]["samples_per_s"],
               "target": SCALING_TARGET} for g in by_gpus if g % 2 == 0 and g // 2 in by_gpus]
    for c in checks:
        verdict = "met" if c["ratio"] >= SCALING_TARGET else "MISSED"
        print(f"{c['gpus']} GPUs over {c['over']}: {c['ratio']:.2f}x samples/s (target >= {SCALING_TARGET}x: {verdict})")
    failures = [f"{r['gpus']} GPU(s): {r['note']}" for r in rows if r["status"] == "failed"]
    for f in failures:
        print(f"FAILED: {f}")
    if ns.json:
        write_result(ns.json, setup={k: v for k, v in vars(ns).items() if k != "trl_worker"}, rows=rows,
                     scaling=checks, failures=failures, wall_s=time.perf_counter() - t0)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
