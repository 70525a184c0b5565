"""What ``--true-on-policy-mode`` costs (issue 41): the same ``relax train`` with and without it, in one run.

    python3 ci/bench_true_on_policy.py --json /tmp/out/true_on_policy.json                 # CPU, quickstart
    python3 ci/bench_true_on_policy.py --device cuda --json /tmp/out/true_on_policy.json   # one GPU
    python3 ci/bench_true_on_policy.py --device cuda --hf-checkpoint bench-270m \
        --prompt-data relax/models/tasks/maxword.jsonl --json ...                           # a 270M model

Three rows, each a fresh ``relax train --preset quickstart`` of ``--steps`` steps with multi-token responses
(``--rollout-max-response-len`` 24, the harness's dense digit reward): the preset's micro-batches (64 of the 256
samples a step), the same with ``--micro-batch-size 1`` (the trainer's share of the mode's cost), and
``--true-on-policy-mode --micro-batch-size 1`` (plus the engine's per-sample recomputation of each finished
request's log-probs). Each row: median step, rollout and train seconds after ``--warmup`` steps, and the worst
train/rollout log-prob gap of the run (0 exactly with the mode). The ratio column is each row's step time over the
default row's.

On a GPU the quickstart's 80k-parameter model is launch-bound: a profiled micro-batch-1 step runs some 2,800 aten
ops per sample (old-log-prob forward, forward, backward), whatever the sizes, so micro-batches of one cost nearly
their count. ``--hf-checkpoint`` measures the mode on a larger model.

Exit status 0 when every row ran, 1 otherwise.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci.bench_grpo_e2e import log, log_tail, run_logged, subprocess_env  # noqa: E402
from ci.provenance import write_result  # noqa: E402
from ci.run_figures import read_jsonl  # noqa: E402
from relax.utils.presets import QUICKSTART  # noqa: E402

ROWS = {
    f"default (micro-batch {QUICKSTART['micro_batch_size']})": [],
    "micro-batch 1": ["--micro-batch-size", "1"],
    "--true-on-policy-mode (micro-batch 1)": ["--true-on-policy-mode", "--micro-batch-size", "1"],
}
GAP_KEY = "train/train_rollout_logprob_abs_diff_max"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    ap.add_argument("--hf-checkpoint", default=None,
                    help="a model preset or HF directory in place of the quickstart's tiny-qwen3 (e.g. bench-270m: the "
                         "mode's cost on a model whose forward is not launch-bound)")
    ap.add_argument("--prompt-data", default=None,
                    help="in place of the quickstart's maxdigit.jsonl (a word-level model such as bench-270m needs "
                         "relax/models/tasks/maxword.jsonl)")
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=600, help="seconds per row")
    ap.add_argument("--json", default=None)
    ns = ap.parse_args(argv)
    if ns.prompt_data:  # the rows run in a scratch directory
        ns.prompt_data = str(Path(ns.prompt_data).resolve())
    if not 0 <= ns.warmup < ns.steps:
        ap.error(f"need 0 <= --warmup ({ns.warmup}) < --steps ({ns.steps})")
    return ns


def run_row(ns: argparse.Namespace, name: str, flags: list[str], workdir: Path) -> dict:
    out = workdir / f"row{len(list(workdir.iterdir()))}"
    cmd = [sys.executable, "-m", "relax.cli", "train", "--preset", "quickstart", "--device", ns.device,
           "--custom-rm-path", "harness.rewards.digit_share", "--rollout-max-response-len", "24",
           "--num-rollout", str(ns.steps), *flags, "--output-dir", str(out)]
    for flag, value in (("--hf-checkpoint", ns.hf_checkpoint), ("--prompt-data", ns.prompt_data)):
        if value:
            cmd[-2:-2] = [flag, value]
    ray_dir = tempfile.mkdtemp(prefix="rt", dir="/tmp")
    try:
        code, wall = run_logged(cmd, workdir / f"{out.name}.log", subprocess_env(ns, ray_dir), ns.timeout, workdir)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    steps = read_jsonl(out / "metrics.jsonl") if (out / "metrics.jsonl").exists() else []
    timed = steps[ns.warmup:]
    row = {"row": name, "flags": flags, "status": "ok" if code == 0 and len(steps) == ns.steps else "failed",
           "wall_s": wall, "steps": len(steps)}
    for key, label in (("perf/step_time_s", "step_s"), ("perf/rollout_time_s", "rollout_s"),
                       ("perf/train_time_s", "train_s"), ("rollout/response_len_mean", "response_len")):
        values = [float(m[key]) for m in timed if key in m]
        row[label] = statistics.median(values) if values else None
    gaps = [float(m[GAP_KEY]) for m in steps if GAP_KEY in m]
    row["logprob_gap_max"] = max(gaps) if gaps else None
    if row["status"] != "ok":
        log(f"{name} FAILED (exit {code}):\n{log_tail(workdir / f'{out.name}.log')}")
    return row


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_top_") as tmp:
        rows = []
        for name, flags in ROWS.items():
            log(f"{name}: relax train, {ns.steps} steps on {ns.device}"
                + (f", {ns.hf_checkpoint}" if ns.hf_checkpoint else ""))
            rows.append(run_row(ns, name, flags, Path(tmp)))
    base = rows[0]["step_s"]
    print(f"{'row':<40} {'step s':>7} {'rollout s':>9} {'train s':>7} {'resp len':>8} {'max |gap|':>10} {'vs default':>10}")
    for row in rows:
        row["step_over_default"] = row["step_s"] / base if row["step_s"] and base else None

        def f(v, spec=".3f"):
            return format(v, spec) if isinstance(v, (int, float)) else "-"

        print(f"{row['row']:<40} {f(row['step_s']):>7} {f(row['rollout_s']):>9} {f(row['train_s']):>7} "
              f"{f(row['response_len'], '.1f'):>8} {f(row['logprob_gap_max'], '.2g'):>10} "
              f"{f(row['step_over_default'], '.2f') + 'x':>10}")
    if ns.json:
        write_result(ns.json, setup=vars(ns), rows=rows, wall_s=time.perf_counter() - t0)
    return 0 if all(r["status"] == "ok" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
