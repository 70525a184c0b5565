"""Step time with a checkpoint every step, with and without --async-save.

    python ci/bench_async_save.py [--steps N] [--out docs/results/async_save.json]      # CPU, torch trainer
    python ci/bench_async_save.py --flags "--device cuda --train-backend megatron --hf-checkpoint bench-270m \
        --prompt-data relax/models/tasks/maxword.jsonl" --out async_save_megatron.json   # GPU, Megatron

Runs the quickstart task (``--flags`` adds to or overrides its flags) saving every step, once plain and once
with --async-save, and reports the mean wall time from one step's end to the next (metrics' perf/step_time_s
leaves the save out: it is taken after the step), skipping the first two steps (warm-up), and the size of one
checkpoint. Writes the JSON with ci/provenance.py's write_result.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
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
    proc = subprocess.run([sys.executable, "-m", "relax.cli", "train", *FLAGS, "--num-rollout", str(steps),
                           "--save", str(root / f"{name}_ckpt"), *extra, "--output-dir", str(out)],
                          env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(f"bench_async_save: the {name} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    ends = [e["time"] for e in events if e["event"] == "step_end"][2:]  # skip warm-up
    return (ends[-1] - ends[0]) / max(len(ends) - 1, 1)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="docs/results/async_save.json")
    parser.add_argument("--flags", default="", help="flags added after the quickstart's (a shell-quoted string)")
    ns = parser.parse_args()
    extra = shlex.split(ns.flags)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = run("plain", extra, ns.steps, root)
        print(f"plain: {plain:.3f}s a step", flush=True)  # a run cut by a time limit still shows this
        background = run("async", [*extra, "--async-save"], ns.steps, root)
        last = max((root / "plain_ckpt").glob("iter_*"))
        ckpt_bytes = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
    print(f"step time with a save ({ckpt_bytes / 1e9:.3f} GB) every step: plain {plain:.3f}s, --async-save "
          f"{background:.3f}s ({background / plain:.2f}x)")
    write_result(ns.out, steps=ns.steps, flags=FLAGS + extra, checkpoint_bytes=ckpt_bytes,
                 step_time_s={"plain": plain, "async_save": background}, ratio=background / plain)
    return 0


if __name__ == "__main__":
    sys.exit(main())
