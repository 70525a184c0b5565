"""Decode projections alone: the Triton skinny GEMM (per config) against cuBLAS (``F.linear``).

    python ci/bench_decode_linear.py [--rows 64 256] --json out.json

Shapes are bench-270m's four projections per layer (fused q/k/v 2048x1024, o 1024x1024, fused
gate/up 6144x1024, down 1024x3072, bf16). Each variant is timed as a CUDA graph of 16 calls, one
per layer's own copy of the weight (384 MB in all at the four shapes, so no call finds its weight
in the 50 MB L2, as in a decode step), replayed 20 times; reported as microseconds per call, the
HBM share it reaches on the weight bytes, and its speed-up over cuBLAS in the same run. The config
that `triton_linear.choose_config` picks (what the engine runs) is marked ``chosen``; the sweep
shows how far the rule is from the best config of the run. ``layer`` rows time the four
projections back to back per layer (16 layers in one graph), as the decode step runs them.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.provenance import provenance  # noqa: E402

SHAPES = {"qkv": (2048, 1024), "o": (1024, 1024), "gate_up": (6144, 1024), "down": (1024, 3072)}
LAYERS = 16
REPLAYS = 20


def graph_us(calls: list, per: int) -> float:
    """Microseconds per ``per`` calls of a CUDA graph of ``calls`` (each called once at warm-up first)."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(REPLAYS):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (REPLAYS * len(calls) / per)


def sweep(m: int, k: int, full: bool) -> list:
    """Configs to try at ``m`` rows: every tile width x K split (x pipeline depth when ``full``)."""
    from relax.backends.embedded.triton_linear import SkinnyConfig

    block_m = 64 if m > 16 else 16
    splits = (1, 2, 4, 8, 16) if full else (1, 2, 4)
    stages = (3, 4) if full else (3,)
    return [SkinnyConfig(block_m=block_m, block_n=bn, block_k=min(128, k // s), split_k=s, num_stages=st)
            for bn, s, st in itertools.product((32, 64, 128), splits, stages) if k // s >= 32]


def measure(m: int, name: str, full: bool, tbps: float) -> list[dict]:
    import torch
    import torch.nn.functional as F

    from relax.backends.embedded.triton_linear import choose_config, skinny_linear

    n, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(m * 7 + n + k)
    weights = [(torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).bfloat16() for _ in range(LAYERS)]
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    expected = x.double() @ weights[0].double().T
    wbytes = n * k * 2
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    chosen = choose_config(m, n, k, sms)
    cublas_us = graph_us([lambda w=w: F.linear(x, w) for w in weights], 1)
    cublas_err = float((F.linear(x, weights[0]).double() - expected).abs().max())
    rows = [dict(rows=m, shape=name, n=n, k=k, variant="cublas", us=cublas_us, hbm_share=wbytes / (cublas_us * 1e-6) / (tbps * 1e12),
                 speedup=1.0, max_err=cublas_err)]
    for cfg in dict.fromkeys([*([chosen] if chosen else []), *sweep(m, k, full)]):
        if not cfg.fits(n, k):
            continue
        try:
            out = skinny_linear(x, weights[0], config=cfg)
            if out is None:
                continue
            err = float((out.double() - expected).abs().max())
            us = graph_us([lambda w=w, cfg=cfg: skinny_linear(x, w, config=cfg) for w in weights], 1)
        except Exception as exc:  # noqa: BLE001 - a config Triton cannot build (shared memory) is a row, not a stop
            rows.append(dict(rows=m, shape=name, variant="triton", config=vars(cfg), error=str(exc).splitlines()[0][:200]))
            continue
        rows.append(dict(rows=m, shape=name, n=n, k=k, variant="triton", config=vars(cfg), chosen=cfg == chosen, us=us,
                         hbm_share=wbytes / (us * 1e-6) / (tbps * 1e12), speedup=cublas_us / us, max_err=err))
    return rows


def layer_rows(m: int, tbps: float) -> list[dict]:
    """The four projections back to back per layer, 16 layers: cuBLAS vs the chosen configs."""
    import torch
    import torch.nn.functional as F

    from relax.backends.embedded.triton_linear import skinny_linear

    gen = torch.Generator(device="cuda").manual_seed(m)
    layers = [{name: (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).bfloat16()
               for name, (n, k) in SHAPES.items()} for _ in range(LAYERS)]
    xs = {name: torch.randn(m, k, generator=gen, device="cuda").bfloat16() for name, (_, k) in SHAPES.items()}
    wbytes = LAYERS * sum(n * k * 2 for n, k in SHAPES.values())

    def run(linear):
        return [lambda w=w, name=name: linear(xs[name], w) for layer in layers for name, w in layer.items()]

    def triton_or_cublas(x, w):
        out = skinny_linear(x, w)
        return F.linear(x, w) if out is None else out

    out = []
    for variant, linear in (("cublas", F.linear), ("triton", triton_or_cublas)):
        us = graph_us(run(linear), LAYERS)
        out.append(dict(rows=m, shape="layer", variant=variant, us_per_layer=us, ms_per_step=us * LAYERS / 1000,
                        hbm_share=wbytes / LAYERS / (us * 1e-6) / (tbps * 1e12)))
    out[1]["speedup"] = out[0]["us_per_layer"] / out[1]["us_per_layer"]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--full-sweep-rows", type=int, nargs="*", default=[64],
                    help="row counts that get the full config sweep (the others: tile width x split 1-4)")
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_decode_linear: needs a CUDA GPU (it times the Triton kernel); "
                 "tests/test_triton_linear.py checks the kernel on CPU under TRITON_INTERPRET=1")
    tbps = 3.35 if "H100" in torch.cuda.get_device_name() else 4.8
    results = []
    for m in ns.rows:
        for name in SHAPES:
            rows = measure(m, name, m in ns.full_sweep_rows, tbps)
            results += rows
            ok = [r for r in rows if "us" in r]
            cub = ok[0]
            best = min(ok, key=lambda r: r["us"])
            chosen = next((r for r in ok if r.get("chosen")), None)
            said = (f"chosen {chosen['us']:6.2f} us ({chosen['speedup']:.2f}x, {chosen['hbm_share']:.0%}, "
                    f"err {chosen['max_err']:.1e})" if chosen else "chosen: none (F.linear)")
            print(f"rows {m:4d} {name:8s}: cuBLAS {cub['us']:6.2f} us ({cub['hbm_share']:.0%} of HBM) | {said} | best "
                  f"{best['us']:6.2f} us {best.get('config', 'cublas')} ({best['hbm_share']:.0%})", flush=True)
        for row in layer_rows(m, tbps):
            results.append(row)
            print(f"rows {m:4d} layer   : {row['variant']:6s} {row['us_per_layer']:6.2f} us per layer, "
                  f"{row['ms_per_step']:.3f} ms per step ({row['hbm_share']:.0%} of HBM)"
                  + (f", {row['speedup']:.2f}x cuBLAS" if "speedup" in row else ""), flush=True)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps({"provenance": provenance(), "setup": vars(ns) | {"json": str(ns.json)},
                                       "hbm_tbps": tbps, "rows": results}, indent=1))


if __name__ == "__main__":
    main()
