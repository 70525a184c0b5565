"""CPU throughput of the fully-async pipeline for max-staleness k = 0, 1, 2 (and colocate).

    python ci/bench_staleness.py [--steps N]

Runs the quickstart task with each setting in turn on this machine and prints one table of
samples/s, with each row's ratio to colocate measured in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = ["--preset", "quickstart", "--rollout-batch-size", "16", "--n-samples-per-prompt", "8",
         "--micro-batch-size", "32", "--rollout-max-response-len", "8", "--rm-type", "exact"]


def run(name: str, extra: list[str], steps: int, root: Path) -> float:
    out = root / name
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "relax.cli", "train", *FLAGS, "--num-rollout", str(steps), *extra,
                    "--output-dir", str(out)], check=True, env=env, capture_output=True)
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()][2:]  # skip warm-up
    samples = sum(r["rollout/num_samples"] for r in rows)
    seconds = sum(r["perf/step_time_s"] for r in rows)
    return samples / seconds


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        results = {"colocate": run("colocate", [], ns.steps, root)}
        for k in (0, 1, 2):
            results[f"fully-async k={k}"] = run(f"async{k}", ["--fully-async", "--max-staleness", str(k)], ns.steps, root)
    base = results["colocate"]
    print(f"{'mode':<20} {'samples/s':>10} {'vs colocate':>12}")
    for name, value in results.items():
        print(f"{name:<20} {value:>10.1f} {value / base:>11.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
