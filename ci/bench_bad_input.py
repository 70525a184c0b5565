"""How fast a launch with bad input fails: `relax train` with one bad path, file or value per case, wall time to exit.

    python3 ci/bench_bad_input.py [--json F] [--repeats 3]

Issue 45: bad data, bad paths and bad files are reported in under 3 s of wall time on the CPU machine, one line
each, exit 2, because they are checked before Ray starts (relax/utils/validation.py, relax/utils/file_checks.py,
relax/data/). Each case runs in a fresh process (``python -m relax.cli train``), so its time includes Python's and
torch's imports. Prints one row per case (median of ``--repeats``) with the line the run printed; exit 1 when a
case does not exit 2 with exactly one line. The target is reported, not asserted.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci.provenance import write_result  # noqa: E402

TARGET_S = 3.0
BASE = ["--preset", "quickstart", "--num-rollout", "1"]


def cases(tmp: Path) -> dict[str, list[str]]:
    """Each case's extra flags; the files they name are made here."""
    from relax.models.registry import build_model, load_tokenizer, save_hf

    hf = save_hf(build_model("tiny-qwen3", seed=1), load_tokenizer("tiny-qwen3"), tmp / "hf")
    weights = hf / "model.safetensors"
    with open(weights, "r+b") as f:
        f.truncate(weights.stat().st_size // 2)
    (tmp / "bad.jsonl").write_text('{"prompt": "1 2", "label": "2"}\n{not json\n')
    (tmp / "a_file").write_text("")
    return {
        "missing --prompt-data file": ["--prompt-data", str(tmp / "nope.jsonl")],
        "malformed --prompt-data line": ["--prompt-data", str(tmp / "bad.jsonl")],
        "truncated --hf-checkpoint weights": ["--hf-checkpoint", str(hf)],
        "--hf-checkpoint neither preset nor dir": ["--hf-checkpoint", str(tmp / "no-model")],
        "--save under a regular file": ["--save", str(tmp / "a_file" / "ckpt")],
        "--output-dir under a regular file": ["--output-dir", str(tmp / "a_file" / "run")],
        "five bad values": ["--rollout-batch-size", "0", "--eps-clip", "-1", "--lr", "-1", "--n-samples-per-prompt",
                            "0", "--rollout-temperature", "-2"],
    }


def run_case(flags: list[str], tmp: Path) -> tuple[float, int, list[str]]:
    out = ["--output-dir", tempfile.mkdtemp(prefix="run", dir=tmp)] if "--output-dir" not in flags else []
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "relax.cli", "train", *BASE, *out, *flags], capture_output=True,
                          text=True, timeout=300, cwd=tmp)
    return time.perf_counter() - start, proc.returncode, [line for line in proc.stderr.splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ns = ap.parse_args(argv)
    rows, bad = [], []
    with tempfile.TemporaryDirectory(prefix="bench_bad_input_") as tmp_dir:
        tmp = Path(tmp_dir)
        for name, flags in cases(tmp).items():
            runs = [run_case(flags, tmp) for _ in range(ns.repeats)]
            seconds = statistics.median(r[0] for r in runs)
            code, lines = runs[-1][1], runs[-1][2]
            expected_lines = 5 if name == "five bad values" else 1
            ok = code == 2 and len(lines) == expected_lines and all(line.startswith("relax: ") for line in lines)
            rows.append({"case": name, "median_s": seconds, "exit": code, "lines": lines, "ok": ok})
            bad += [] if ok else [name]
            print(f"{seconds:6.2f} s  exit {code}  {'ok ' if ok else 'BAD'}  {name}: {lines[0] if lines else '(nothing)'}"
                  + (f" (+{len(lines) - 1} lines)" if len(lines) > 1 else ""))
    worst = max(r["median_s"] for r in rows)
    print(f"slowest {worst:.2f} s (target < {TARGET_S:g} s: {'met' if worst < TARGET_S else 'MISSED'})")
    if ns.json:
        write_result(ns.json, rows=rows, target_s=TARGET_S, slowest_s=worst, repeats=ns.repeats)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
