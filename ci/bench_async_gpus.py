"""Fully-async vs colocate samples/s on two GPUs, side by side in one run (issue 7, benchmark 4).

    python3 ci/bench_async_gpus.py                       # 2 GPUs: megatron backend when importable, else torch
    python3 ci/bench_async_gpus.py --backend torch --steps 10 --json /tmp/out/async.json

The workload is ci/bench_grpo_e2e.py's (bench-270m, 8 prompts x 8 completions of <= 256 tokens
after 128-token prompts, GRPO, one optimizer step per rollout; see that docstring), run by
``relax train`` in three placements of the same two GPUs:

* ``colocate``: ``--colocate --resource {"actor": [1, 1], "rollout": [2, 1]}``: the trainer shares
  GPU 0 with engine 0, engine 1 has GPU 1; rollout, train and sync take turns (the trainer is one
  GPU: data-parallel training is not built, so GPU 1 idles while the trainer trains); engine 0 gets
  the weights by CUDA IPC, engine 1 by NCCL broadcast (``--weight-sync-transport auto``);
* ``fully-async k``: ``--fully-async --max-staleness k --resource {"actor": [1, 1], "rollout": [1, 1]}``:
  the trainer has GPU 0, the engine GPU 1 (weights by NCCL broadcast), and rollout for step
  s+1..s+k runs while step s trains.

samples/s = completions per step / median step time (steps after ``--warmup``); each row's ratio
is to the colocate row of the same run. Target (issue "Many GPUs", docs/DESIGN.md): fully-async >= 2x colocate.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci import bench_grpo_e2e as grpo  # noqa: E402

TARGET = 2.0
PLACEMENTS = {
    "colocate": ("--colocate", "--resource", '{"actor": [1, 1], "rollout": [2, 1]}'),
    "fully-async k=1": ("--fully-async", "--max-staleness", "1", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}'),
    "fully-async k=2": ("--fully-async", "--max-staleness", "2", "--resource", '{"actor": [1, 1], "rollout": [1, 1]}'),
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["megatron", "torch"], default=None, help="default: megatron when importable")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--workdir", default=None)
    own, rest = ap.parse_known_args(argv)
    import torch

    from relax.backends.megatron.checks import module_available

    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        print("bench_async_gpus: needs 2 CUDA GPUs", file=sys.stderr)
        return 2
    backend = own.backend or ("megatron" if module_available("megatron.core") else "torch")
    ns = grpo.parse([*rest, "--steps", str(own.steps), "--warmup", str(own.warmup)])
    workdir = Path(own.workdir or tempfile.mkdtemp(prefix="bench_async_"))
    workdir.mkdir(parents=True, exist_ok=True)
    prompts = grpo.write_prompts(ns, workdir)
    rows = []
    for name, mode in PLACEMENTS.items():
        res = grpo.run_relax(ns, backend, prompts, workdir, name=name.replace(" ", "_").replace("=", ""), mode=mode)
        step = res.median_step_s
        rows.append({"placement": name, "status": res.status, "median_step_s": step,
                     "samples_per_s": res.completions / step if step else None,
                     "rollout_s": res._median(res.rollout_s), "train_s": res._median(res.train_s),
                     "sync_s": res._median(res.sync_s), "per_step_s": res.step_s, "note": res.note})
    base = rows[0]["samples_per_s"]
    print(f"bench_async_gpus: {ns.model}, {backend} backend, {ns.prompts}x{ns.generations} completions per step, "
          f"<= {ns.max_new} new tokens, {ns.steps} steps, medians over the last {ns.steps - ns.warmup}; "
          f"{torch.cuda.get_device_name()} x{torch.cuda.device_count()}")
    print(f"{'placement':<18} {'step s':>8} {'samples/s':>10} {'rollout s':>10} {'train s':>8} {'sync s':>7} "
          f"{'vs colocate':>12}  target >= {TARGET}x")
    for r in rows:
        ratio = r["samples_per_s"] / base if base and r["samples_per_s"] else None
        r["vs_colocate"] = ratio
        fmt = lambda v, spec: format(v, spec) if v is not None else "-"  # noqa: E731
        met = "" if r["placement"] == "colocate" or ratio is None else ("met" if ratio >= TARGET else "MISSED")
        print(f"{r['placement']:<18} {fmt(r['median_step_s'], '.3f'):>8} {fmt(r['samples_per_s'], '.1f'):>10} "
              f"{fmt(r['rollout_s'], '.3f'):>10} {fmt(r['train_s'], '.3f'):>8} {fmt(r['sync_s'], '.3f'):>7} "
              f"{fmt(ratio, '.2f'):>11}x  {met}")
    if own.json:
        from ci.provenance import provenance

        Path(own.json).write_text(json.dumps({"backend": backend, "rows": rows, "target": TARGET,
                                              "provenance": provenance(sys.argv)}, indent=1))
    return 1 if any(r["status"] != "ok" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
