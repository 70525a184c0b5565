"""CPU step time with a checkpoint every step, with and without --async-save.

    python ci/bench_async_save.py [--steps N] [--out docs/results/async_save.json]

Runs the quickstart task saving every step, once plain and once with --async-save, and reports the mean
wall time from one step's end to the next (metrics' perf/step_time_s leaves the save out: it is taken
after the step), skipping the first two steps (warm-up). Writes the JSON with ci/provenance.py's write_result.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from ci.provenance import write_result

FLAGS = ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
         "--global-batch-size", "32", "--micro-batch-size", "16", "--save-interval", "1"]


def run(name: str, extra: list[str], steps: int, root: Path) -> float:
    out = root / name
    env = dict(os.environ, OMP_NUM_THREADS="1")
    subprocess.run([sys.executable, "-m", "relax.cli", "train", *FLAGS, "--num-rollout", str(steps),
                    "--save", str(root / f"{name}_ckpt"), *extra, "--output-dir", str(out)],
                   check=True, env=env, capture_output=True)
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    ends = [e["time"] for e in events if e["event"] == "step_end"][2:]  # skip warm-up
    return (ends[-1] - ends[0]) / max(len(ends) - 1, 1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="docs/results/async_save.json")
    ns = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = run("plain", [], ns.steps, root)
        background = run("async", ["--async-save"], ns.steps, root)
    print(f"step time with a save every step: plain {plain:.3f}s, --async-save {background:.3f}s "
          f"({background / plain:.2f}x)")
    write_result(ns.out, steps=ns.steps, step_time_s={"plain": plain, "async_save": background},
                 ratio=background / plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
