"""Encode + decode time of one rollout's ``/generate`` answer: the standard library's json vs orjson.

    python3 ci/bench_json_codec.py [--batch 64] [--tokens 256] [--repeats 20] [--json OUT.json]

The answer is what the embedded server returns for a batched ``/generate`` with ``return_logprob``
(SGLang's shape: ``output_ids`` and ``meta_info.output_token_logprobs`` triples per request); the
GRPO benchmark's workload is 64 requests x 256 tokens. Each codec encodes and decodes it
``--repeats`` times; the median of each is reported with orjson's speed-up over json (the reference,
measured in the same run). relax uses orjson on this path (relax/utils/json_codec.py).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.provenance import provenance  # noqa: E402


def answer(batch: int, tokens: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(batch):
        ids = [rng.randrange(32000) for _ in range(tokens)]
        out.append({"text": " ".join(f"w{t}" for t in ids), "output_ids": ids,
                    "meta_info": {"id": f"{i:032x}", "finish_reason": {"type": "length", "length": tokens},
                                  "prompt_tokens": 128, "completion_tokens": tokens, "cached_tokens": 0,
                                  "weight_version": "7", "e2e_latency": 0.5,
                                  "output_token_logprobs": [[-rng.random() * 10, t, None] for t in ids]}})
    return out


def timed(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--json", default=None, help="write the results here")
    ns = ap.parse_args(argv)
    data = answer(ns.batch, ns.tokens)
    std_bytes, fast_bytes = json.dumps(data).encode(), orjson.dumps(data)
    assert json.loads(fast_bytes) == json.loads(std_bytes)  # the same document either way
    rows = {}
    for name, dumps, loads, body in (("json", lambda: json.dumps(data).encode(), lambda: json.loads(std_bytes),
                                      std_bytes),
                                     ("orjson", lambda: orjson.dumps(data), lambda: orjson.loads(fast_bytes),
                                      fast_bytes)):
        rows[name] = {"bytes": len(body), "dumps_ms": 1e3 * timed(dumps, ns.repeats),
                      "loads_ms": 1e3 * timed(loads, ns.repeats)}
        rows[name]["total_ms"] = rows[name]["dumps_ms"] + rows[name]["loads_ms"]
    ratio = rows["json"]["total_ms"] / rows["orjson"]["total_ms"]
    for name, r in rows.items():
        print(f"{name:7s} {r['bytes'] / 1e6:.2f} MB  dumps {r['dumps_ms']:6.2f} ms  loads {r['loads_ms']:6.2f} ms")
    print(f"orjson vs json (reference): {ratio:.1f}x faster per encode + decode")
    if ns.json:
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"provenance": provenance(argv), "setup": vars(ns), "rows": rows,
                                             "speedup_vs_json": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
