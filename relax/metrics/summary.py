"""``python -m relax.metrics.summary RUN_DIR``: did the run learn? Where are its artifacts?"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def learning_summary(run_dir: str | Path, window: int = 5) -> dict[str, float]:
    rows = [json.loads(line) for line in (Path(run_dir) / "metrics.jsonl").read_text().splitlines() if line.strip()]
    if not rows:
        raise ValueError(f"{run_dir}/metrics.jsonl has no steps")
    rewards = [float(r["rollout/reward_mean"]) for r in rows]
    first = sum(rewards[:window]) / len(rewards[:window])
    last = sum(rewards[-window:]) / len(rewards[-window:])
    return {"steps": len(rows), "first_reward_mean": first, "last_reward_mean": last}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print("usage: python -m relax.metrics.summary RUN_DIR", file=sys.stderr)
        return 2
    run_dir = Path(argv[0])
    s = learning_summary(run_dir)
    print(
        f"{s['steps']} steps: mean reward of the first 5 steps {s['first_reward_mean']:.3f}, "
        f"of the last 5 steps {s['last_reward_mean']:.3f}"
    )
    print(f"artifacts: {run_dir.resolve()}/ (metrics.jsonl, weights.jsonl, events.jsonl, samples.jsonl, run.json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
