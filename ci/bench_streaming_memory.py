"""Peak memory of the prompt loaders: the in-memory one vs ``--use-streaming-dataset``, on a large parquet file.

    python3 ci/bench_streaming_memory.py [--rows 10000000] [--batches 2000] [--json F]

Writes a synthetic parquet of ``--rows`` short prompts (``"a,b="`` -> ``max(a, b)``, the maxdigit task's shape) into
a temporary folder, in row groups written one at a time (the writer never holds the file). Then each loader runs in
a fresh process (``--child``): it builds the default data source (`RolloutDataSourceWithBuffer`, tokenizer
tiny-qwen3, ``--rollout-shuffle``) and draws ``--batches`` rollout batches of ``--rollout-batch-size`` prompts.
Each child reports its peak RSS (``ru_maxrss``), its RSS after the imports (the baseline both share), the time to
build the source and the time to draw. The in-memory child is stopped when its RSS passes ``--cap-gb`` (polled every
0.1 s; the machine may be shared): the result then says so, and the cap is a lower bound of its peak and of the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci.provenance import write_result  # noqa: E402

GROUP_ROWS = 100_000


def write_parquet(path: Path, rows: int) -> None:
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    schema = pa.schema([("prompt", pa.string()), ("label", pa.string())])
    with pq.ParquetWriter(path, schema) as writer:
        for start in range(0, rows, GROUP_ROWS):
            n = min(rows, start + GROUP_ROWS) - start
            pairs = rng.integers(0, 100, size=(n, 2)).tolist()
            writer.write_table(pa.table({"prompt": [f"{a},{b}=" for a, b in pairs],
                                         "label": [str(max(a, b)) for a, b in pairs]}, schema=schema))


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def child(mode: str, data: str, batches: int, batch_size: int, buffer_size: int) -> dict:
    """One loader in this process: build it, draw ``batches`` batches, report memory and times."""
    from argparse import Namespace

    from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
    from relax.models import load_tokenizer

    tokenizer = load_tokenizer("tiny-qwen3")
    tokenizer.encode("0,1=", add_special_tokens=False)
    base_mb = _rss_mb()
    args = Namespace(prompt_data=data, hf_checkpoint="tiny-qwen3", input_key="prompt", label_key="label",
                     metadata_key="metadata", tool_key="tools", apply_chat_template=False,
                     apply_chat_template_kwargs={}, system_prompt=None, rollout_max_prompt_len=None,
                     custom_prompt_path=None, use_streaming_dataset=mode == "streaming",
                     streaming_buffer_size=buffer_size, n_samples_per_prompt=1, rollout_shuffle=True,
                     rollout_seed=42, buffer_filter_path=None)
    start = time.perf_counter()
    source = RolloutDataSourceWithBuffer(args, tokenizer=tokenizer)
    built = time.perf_counter()
    drawn = 0
    for _ in range(batches):
        drawn += len(source.get_samples(batch_size))
    done = time.perf_counter()
    return {"mode": mode, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "baseline_rss_mb": base_mb, "build_s": built - start, "draw_s": done - built, "prompts_drawn": drawn}


def _vm_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as fh:
            return next(int(line.split()[1]) / 1024 for line in fh if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0.0


def run_child(mode: str, data: Path, ns: argparse.Namespace) -> dict:
    """Run one loader in a fresh process; the in-memory one is stopped when its RSS passes ``--cap-gb`` (the machine
    is shared: its peak is then reported as at least the cap)."""
    cmd = [sys.executable, __file__, "--child", mode, "--data", str(data), "--batches", str(ns.batches),
           "--rollout-batch-size", str(ns.rollout_batch_size), "--streaming-buffer-size", str(ns.streaming_buffer_size)]
    cap_mb = ns.cap_gb * 1024 if mode == "memory" else None
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1"))
    capped = False
    while proc.poll() is None:
        if cap_mb and _vm_rss_mb(proc.pid) > cap_mb:
            proc.kill()
            capped = True
            break
        time.sleep(0.1)
    out, err = proc.communicate()
    wall = time.perf_counter() - start
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if proc.returncode == 0 and lines:
        return {**json.loads(lines[-1]), "wall_s": wall, "completed": True}
    if capped:
        return {"mode": mode, "completed": False, "wall_s": wall, "peak_rss_mb": cap_mb,
                "error": f"stopped at {ns.cap_gb:g} GB RSS after {wall:.0f} s, still building the source"}
    tail = (err.strip().splitlines() or ["(no output)"])[-1]
    return {"mode": mode, "completed": False, "wall_s": wall, "error": tail[:300], "peak_rss_mb": None}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--batches", type=int, default=2000)
    ap.add_argument("--rollout-batch-size", type=int, default=32)
    ap.add_argument("--streaming-buffer-size", type=int, default=10_000)
    ap.add_argument("--cap-gb", type=float, default=12.0, help="RSS at which the in-memory child is stopped")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", choices=("memory", "streaming"), default=None)
    ap.add_argument("--data", default=None)
    ns = ap.parse_args(argv)
    if ns.child:
        print(json.dumps(child(ns.child, ns.data, ns.batches, ns.rollout_batch_size, ns.streaming_buffer_size)))
        return 0
    with tempfile.TemporaryDirectory(prefix="bench_streaming_") as tmp:
        data = Path(tmp) / "prompts.parquet"
        start = time.perf_counter()
        write_parquet(data, ns.rows)
        write_s = time.perf_counter() - start
        file_mb = data.stat().st_size / 2**20
        print(f"wrote {ns.rows:,} rows ({file_mb:.2f} MiB) in {write_s:.1f} s")
        results = {}
        for mode in ("streaming", "memory"):
            results[mode] = r = run_child(mode, data, ns)
            print(f"{mode:9s} peak RSS {r['peak_rss_mb']:.0f} MB" + (
                f" (baseline {r['baseline_rss_mb']:.0f} MB), build {r['build_s']:.1f} s, draw {r['draw_s']:.1f} s"
                if r["completed"] else f" cap: did not complete ({r['error']})"))
        ratio = results["memory"]["peak_rss_mb"] / results["streaming"]["peak_rss_mb"]
        bound = "" if results["memory"]["completed"] else " (at least: the in-memory loader hit the cap)"
        print(f"in-memory / streaming peak RSS: {ratio:.1f}x{bound}")
    if ns.json:
        write_result(ns.json, rows=ns.rows, batches=ns.batches, rollout_batch_size=ns.rollout_batch_size,
                     streaming_buffer_size=ns.streaming_buffer_size, cap_gb=ns.cap_gb, write_s=write_s,
                     file_mb=file_mb, results=results, peak_rss_ratio=ratio,
                     ratio_is_lower_bound=not results["memory"]["completed"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
