"""Wall time of a run that saves checkpoints, with and without --async-save.

    python ci/bench_async_save.py [--steps N] [--out docs/results/async_save.json]      # CPU, torch trainer
    python ci/bench_async_save.py --flags "--device cuda --train-backend megatron --hf-checkpoint bench-270m \
        --prompt-data relax/models/tasks/maxword.jsonl" --out async_save_megatron.json   # GPU, Megatron

Runs the quickstart task (``--flags`` adds to or overrides its flags; ``--save-interval`` 1 unless it sets
another) once plain and once with --async-save, and reports, from each run's events.jsonl:

- ``wall_s``: from step 1's start to the run's end, which comes after the last checkpoint is durable (an
  async run waits for its writes there), so both runs count every save they make, the first one's one-time
  setup included; step 0 is left out (its compilations run faster in the second run, from the first's caches);
- ``blocked_s``: the time from each step's weight sync to its end, where the loop saves (a plain save writes
  there; an async one waits there for the previous write, if still running, and copies to host memory).

The ratio is async / plain ``wall_s``. Async saving can only hide a write behind the training between two
saves: with short steps and large checkpoints nothing is hidden. Writes the JSON with ci/provenance.py's
write_result. ``--keep DIR`` copies each run's events.jsonl there; ``--events DIR`` computes the figures from such
a copy instead of running.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

from ci.provenance import write_result
from ci.run_figures import train_run

FLAGS = ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
         "--global-batch-size", "32", "--micro-batch-size", "16", "--save-interval", "1"]


def timeline(events: list[dict]) -> dict[str, float]:
    """``wall_s`` and ``blocked_s`` of one run (the module docstring says what each counts)."""
    start = next(e["time"] for e in events if e["event"] == "step_start" and e["step"] == 1)  # after the warm-up
    end = next(e["time"] for e in events if e["event"] == "run_end")
    step_ends = {e["step"]: e["time"] for e in events if e["event"] == "step_end"}
    synced = {e["step"]: e["time"] for e in events if e["event"] == "weights_synced" and e.get("step") in step_ends}
    blocked = sum(step_ends[step] - t for step, t in synced.items())  # a step's sync -> its end: the saving
    saves = sum(e["event"] == "checkpoint_saved" for e in events)
    return {"wall_s": end - start, "blocked_s": blocked, "checkpoints": saves}


def run(name: str, extra: list[str], steps: int, root: Path, keep: Path | None = None) -> dict[str, float]:
    flags = [*FLAGS, "--num-rollout", str(steps), "--save", str(root / f"{name}_ckpt"), *extra]
    out = train_run("bench_async_save", name, flags, root / name, keep)
    return timeline([json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default="docs/results/async_save.json")
    parser.add_argument("--flags", default="", help="flags added after the quickstart's (a shell-quoted string)")
    parser.add_argument("--keep", type=Path, help="copy each run's events.jsonl and metrics.jsonl here")
    parser.add_argument("--events", type=Path, help="a --keep directory: compute the figures from it, run nothing")
    ns = parser.parse_args()
    extra = shlex.split(ns.flags)
    if ns.events:
        plain, background = (timeline([json.loads(line) for line in (ns.events / f"{name}_events.jsonl").open()])
                             for name in ("plain", "async"))
        ratio = background["wall_s"] / plain["wall_s"]
        print(f"from {ns.events}: wall plain {plain['wall_s']:.2f}s (blocked {plain['blocked_s']:.2f}s), --async-save "
              f"{background['wall_s']:.2f}s (blocked {background['blocked_s']:.2f}s); {ratio:.2f}x")
        write_result(ns.out, steps=ns.steps, flags=FLAGS + extra, events=str(ns.events), plain=plain,
                     async_save=background, ratio=ratio)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        plain = run("plain", extra, ns.steps, root, ns.keep)
        print(f"plain: {plain}", flush=True)  # a run cut by a time limit still shows this
        background = run("async", [*extra, "--async-save"], ns.steps, root, ns.keep)
        last = max((root / "plain_ckpt").glob("iter_*"))
        ckpt_bytes = sum(f.stat().st_size for f in last.rglob("*") if f.is_file())
    ratio = background["wall_s"] / plain["wall_s"]
    print(f"{ns.steps} steps, {plain['checkpoints']} checkpoints of {ckpt_bytes / 1e9:.3f} GB: wall plain "
          f"{plain['wall_s']:.2f}s (blocked {plain['blocked_s']:.2f}s), --async-save {background['wall_s']:.2f}s "
          f"(blocked {background['blocked_s']:.2f}s); {ratio:.2f}x")
    write_result(ns.out, steps=ns.steps, flags=FLAGS + extra, checkpoint_bytes=ckpt_bytes,
                 plain=plain, async_save=background, ratio=ratio)
    return 0


if __name__ == "__main__":
    sys.exit(main())
