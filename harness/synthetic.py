"""Synthetic, contract-valid run directories: the test bed for checks and reports.

``make_run(dir)`` writes a healthy run; tests then plant one defect (a corrupted checksum, a
missing engine record, a lost sample, ...) and prove the matching check fails.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

TENSORS = ("model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight",
           "model.layers.0.mlp.up_proj.weight", "lm_head.weight")


def write_jsonl(path: Path, records: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def make_run(directory: str | Path, *, steps: int = 6, engines: int = 2, groups: int = 4, n: int = 2,
             loss_offset: float = 0.0, reward_start: float = 0.1, reward_slope: float = 0.1,
             step_time_s: float = 0.5, status: str = "completed", error: str | None = None,
             dtype: str = "float32", response_len: float = 20.0) -> Path:
    """A healthy run of ``steps`` steps, ``groups`` x ``n`` samples each, one step every ``step_time_s``
    seconds (step_end events), fp32 by default (``dtype="bfloat16"`` for a bf16 pair)."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    t = time.time()
    metrics, weights, samples = [], [], []
    events: list[dict[str, Any]] = [{"time": t, "event": "run_start"},
                                    {"time": t, "event": "process_started", "role": "trainer:0", "pid": 101}]
    events += [{"time": t, "event": "process_started", "role": f"engine:{i}", "pid": 200 + i} for i in range(engines)]
    for version in range(steps + 1):
        sums = {name: f"{abs(hash((name, version))) % 16**12:012x}" for name in TENSORS}
        weights.append({"version": version, "side": "trainer", "step": max(version - 1, 0), "time": t, "checksums": sums})
        weights += [{"version": version, "side": f"engine:{i}", "step": max(version - 1, 0), "time": t,
                     "checksums": dict(sums)} for i in range(engines)]
    for step in range(steps):
        start = t + step * step_time_s
        events.append({"time": start, "event": "step_start", "step": step})
        metrics.append({"step": step, "weight_version": step, "time": start + step_time_s,
                        "rollout/reward_mean": reward_start + reward_slope * step, "rollout/num_samples": groups * n,
                        "rollout/response_len_mean": response_len,
                        "train/loss": math.exp(-0.3 * step) + loss_offset, "train/grad_norm": 1.0 / (1 + step),
                        "train/ppo_kl": 0.0 if step == 0 else 1e-4, "train/train_rollout_logprob_abs_diff": 2e-7,
                        "train/train_rollout_logprob_abs_diff_max": 1e-6,
                        "train/train_rollout_logprob_abs_diff_p99": 5e-7, "train/train_rollout_kl": 1e-9,
                        "perf/step_time_s": step_time_s})
        ids = [(step * groups + g, (step * groups + g) * n + i) for g in range(groups) for i in range(n)]
        samples += [{"step": step, "group_index": g, "index": i, "attempts": 1, "fate": "trained", "reason": None}
                    for g, i in ids]
        samples += [{"step": step, "group_index": g, "index": i, "fate": "consumed", "passes": 1, "reason": None}
                    for g, i in ids]
        events.append({"time": start + step_time_s, "event": "step_end", "step": step})
    events.append({"time": t + steps * step_time_s, "event": "run_end", "status": status})
    write_jsonl(d / "metrics.jsonl", metrics)
    write_jsonl(d / "weights.jsonl", weights)
    write_jsonl(d / "events.jsonl", events)
    write_jsonl(d / "samples.jsonl", samples)
    (d / "run.json").write_text(json.dumps({
        "status": status, "exit_code": 0 if status == "completed" else 1, "error": error,
        "config": {"num_rollout": steps, "rollout_batch_size": groups, "n_samples_per_prompt": n},
        "versions": {"relax": "synthetic"}, "device": "cpu", "dtypes": {"trainer": dtype, "engine": dtype},
        "seeds": {"seed": 1, "rollout_seed": 42}, "start_time": t, "end_time": t + steps * step_time_s,
        "output_dir": str(d)}))
    return d


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(x) for x in Path(path).read_text().splitlines() if x.strip()]


def edit_jsonl(path: Path, fn) -> None:
    """Rewrite a JSONL file through ``fn(records) -> records``."""
    write_jsonl(path, fn(read_jsonl(path)))
