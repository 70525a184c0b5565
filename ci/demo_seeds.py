"""Does the demo learn and keep what it learned, on more than one seed? (issue 40)

Runs ``relax train --preset quickstart`` once per ``--seed`` (the model's initialisation; the preset's own is
the flag's default, 1234), several at a time, each single-threaded as ``nox -s demo`` runs it, then reads
every run's metrics.jsonl:

- ``first5`` / ``last5``: what ``python -m relax.metrics.summary`` prints for the run;
- ``last20``: the mean reward of the final 20 steps (target >= 0.85);
- ``drop``: the best 20-step window ending in the last 100 steps minus the final one (target <= 0.03:
  no decay at the end of the run);
- ``stuck``: prompts whose samples in the last 50 steps all failed (GRPO gives such a group zero advantage,
  so only the entropy bonus can free it).

    python ci/demo_seeds.py --seeds 1234 1 2 --jobs 2 --out docs/results/demo_seeds_cpu.json [-- EXTRA FLAGS]

Prints one line per seed and writes the JSON (figures, per-20-step curves, provenance); exits 1 when a target
is missed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ci.provenance import provenance  # noqa: E402

SINGLE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
                 "HF_HUB_OFFLINE": "1"}  # as noxfile.py's demo session
MIN_LAST20, MAX_DROP = 0.85, 0.03


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def figures(run_dir: Path, window: int = 20, tail: int = 100) -> dict:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    reward = [float(r["rollout/reward_mean"]) for r in rows]
    entropy = [float(r.get("train/entropy", float("nan"))) for r in rows]
    windows = [_mean(reward[i - window:i]) for i in range(window, len(reward) + 1)]
    ending_late = windows[-(tail - window + 1):]
    return {
        "steps": len(reward), "first5": _mean(reward[:5]), "last5": _mean(reward[-5:]), "last20": windows[-1],
        "best20": max(windows), "best20_end_step": windows.index(max(windows)) + window,
        "drop": max(ending_late) - windows[-1], "stuck": _stuck_prompts(run_dir, len(reward) - 50),
        "reward_per_20": [round(_mean(reward[i:i + window]), 4) for i in range(0, len(reward), window)],
        "entropy_per_20": [round(_mean(entropy[i:i + window]), 4) for i in range(0, len(entropy), window)],
    }


def _stuck_prompts(run_dir: Path, from_step: int) -> int:
    """Prompts of the data set none of whose samples scored from ``from_step`` on (a group's index counts on
    across epochs: modulo the data set's size it is the prompt)."""
    data = json.loads((run_dir / "run.json").read_text())["config"]["prompt_data"]
    num_prompts = sum(1 for line in Path(data).read_text().splitlines() if line.strip())
    best: dict[int, float] = defaultdict(float)
    for line in (run_dir / "samples.jsonl").read_text().splitlines():
        s = json.loads(line)
        if s["step"] >= from_step and "reward" in s:
            prompt = s["group_index"] % num_prompts
            best[prompt] = max(best[prompt], float(s["reward"]))
    return sum(1 for v in best.values() if v <= 0.0)


def run_seeds(seeds: list[int], root: Path, jobs: int, extra: list[str]) -> dict[int, dict]:
    env = {**os.environ, **SINGLE_THREAD}
    pending, running, done = list(seeds), {}, {}
    while pending or running:
        while pending and len(running) < jobs:
            seed = pending.pop(0)
            out = root / f"seed{seed}"
            cmd = [sys.executable, "-m", "relax.cli", "train", "--preset", "quickstart", "--output-dir", str(out),
                   "--overwrite-output-dir", "--seed", str(seed), *extra]
            log = open(root / f"seed{seed}.log", "w")  # noqa: SIM115 (closed when the run ends)
            running[seed] = (subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT), log,
                             time.monotonic())
        time.sleep(2)
        for seed, (proc, log, start) in list(running.items()):
            if proc.poll() is None:
                continue
            log.close()
            del running[seed]
            if proc.returncode != 0:
                raise SystemExit(f"seed {seed}: relax train exited {proc.returncode}; see {root}/seed{seed}.log")
            done[seed] = {"seed": seed, "wall_s": round(time.monotonic() - start, 1),
                          **figures(root / f"seed{seed}")}
    return {s: done[s] for s in seeds}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[1234, 1, 2])
    p.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    p.add_argument("--runs", type=Path, default=ROOT / "runs" / "demo_seeds")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.runs.mkdir(parents=True, exist_ok=True)
    results = run_seeds(args.seeds, args.runs, args.jobs, extra)
    ok = True
    for r in results.values():
        met = r["last20"] >= MIN_LAST20 and r["drop"] <= MAX_DROP
        ok &= met
        print(f"seed {r['seed']:>5}: first5 {r['first5']:.3f} last5 {r['last5']:.3f} last20 {r['last20']:.3f} "
              f"best20 {r['best20']:.3f} (step {r['best20_end_step']}) drop {r['drop']:.3f} stuck {r['stuck']} "
              f"{r['wall_s']:.0f} s {'ok' if met else 'MISSED'}")
    if args.out:
        doc = {"provenance": provenance(), "extra_flags": extra,
               "targets": {"last20_min": MIN_LAST20, "drop_max": MAX_DROP}, "all_met": ok,
               "seeds": list(results.values())}
        args.out.write_text(json.dumps(doc, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
