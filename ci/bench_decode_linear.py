"""Decode projections as a chain: cuBLAS against relax's Triton skinny GEMM with and without PDL.

    python ci/bench_decode_linear.py [--rows 64] [--layers 16] --json out.json

bench-270m's four projections per layer (fused q/k/v 2048x1024, o 1024x1024, fused gate/up 6144x1024,
down 1024x3072, bf16), each reading the output of the one before (o reads q/k/v's first 1024 columns, down
gate/up's first 3072), for ``--layers`` layers with weights of their own (384 MB at 16: no projection finds
its weight in the 50 MB L2), captured as one CUDA graph and replayed; reported as microseconds per layer
(best and median of 5 timings of 50 replays) and the speed-up over cuBLAS in the same run. Variants:

* ``cublas``: ``F.linear``;
* ``skinny``: `relax.backends.embedded.triton_linear.skinny_linear` launched plainly;
* ``skinny_pdl``: the same kernel launched with programmatic dependent launch (what the lean runner runs on
  Hopper): each kernel starts during its predecessor and waits in ``gdc_wait``;
* ``splitk_pdl``: split-K for every projection, `triton_linear.skinny_partials` (the kernel the lean runner runs
  for o and down) at the per-projection configs of `SPLITK_CONFIGS`, its fp32 partials summed by a second PDL
  kernel here (the runner sums them inside its next fused kernel instead, which a chain of projections has not).

Outputs are compared with cuBLAS's (relative max difference: bf16 rounding of a different sum order).

``--sweep`` times each projection alone instead (gate/up with its ``silu(gate) * up`` epilogue, as the runner
calls it; the LM head too, ``--shapes`` picks), chained over copies of its weight (200 MB: no L2 hits), cuBLAS
first, then every tile of `SWEEP` that divides it (`triton_linear.Tile`: rows, columns, K step, warps, stages; and
K splits), with PDL, against the default tile.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.provenance import provenance  # noqa: E402

SHAPES = {"qkv": (2048, 1024), "o": (1024, 1024), "gate_up": (6144, 1024), "down": (1024, 3072)}
SWEEP_SHAPES = {**SHAPES, "lm_head": (32000, 1024)}  # --sweep: the layer's projections and the LM head (vocab 32000)
# per projection: column tile, K splits, K block, warps, pipeline stages
SPLITK_CONFIGS = {"qkv": (64, 2, 128, 4, 4), "o": (32, 4, 128, 4, 2), "gate_up": (64, 1, 128, 4, 4),
                  "down": (64, 4, 128, 4, 4)}
REPLAYS, TIMINGS = 50, 5


def _sum_cast_kernel():
    import triton
    import triton.language as tl

    @triton.jit
    def sum_cast(P, OUT, TOTAL, SPLITS: tl.constexpr, BLOCK: tl.constexpr):
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < TOTAL
        acc = tl.zeros((BLOCK,), tl.float32)
        for s in tl.static_range(SPLITS):
            acc += tl.load(P + s * TOTAL + offs, mask=mask, other=0.0)
        tl.store(OUT + offs, acc.to(OUT.dtype.element_ty), mask=mask)

    return sum_cast


def variants(rows: int) -> dict:
    """name -> projection function ``(x, weight, name) -> out``."""
    import torch
    import torch.nn.functional as F
    import triton

    from relax.backends.embedded import triton_linear

    sum_cast = _sum_cast_kernel()
    outs = {nm: torch.empty(rows, n, device="cuda", dtype=torch.bfloat16) for nm, (n, _) in SHAPES.items()}

    def splitk_pdl(x, w, nm):
        bn, splits, bk, warps, stages = SPLITK_CONFIGS[nm]
        parts = triton_linear.skinny_partials(x, w, None, splits, pdl=True,
                                              tile=triton_linear.Tile(64, bn, bk, warps, stages))
        total = parts[0].numel()
        sum_cast[(triton.cdiv(total, 1024),)](parts, outs[nm], total, SPLITS=splits, BLOCK=1024, launch_pdl=True)
        return outs[nm]

    return {"cublas": lambda x, w, nm: F.linear(x, w),
            "skinny": lambda x, w, nm: triton_linear.skinny_linear(x, w, pdl=False),
            "skinny_pdl": lambda x, w, nm: triton_linear.skinny_linear(x, w, pdl=True),
            "splitk_pdl": splitk_pdl}


def time_graph(run) -> tuple[float, float, object]:
    """``run()`` captured as one CUDA graph: (best, median) microseconds of a replay over `TIMINGS` timings of
    `REPLAYS` replays, and the captured run's output."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        run()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    graph.replay()
    torch.cuda.synchronize()
    per_replay = []
    for _ in range(TIMINGS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(REPLAYS):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_replay.append(start.elapsed_time(end) * 1000 / REPLAYS)
    per_replay.sort()
    return per_replay[0], per_replay[len(per_replay) // 2], out


def time_chain(linear, layers: list[dict], x0) -> tuple[float, float, object]:
    """The four projections of every layer, each reading the one before: (best, median) us per layer, output."""
    def run():
        h = x0
        for layer in layers:
            qkv = linear(h, layer["qkv"], "qkv")
            o = linear(qkv[:, :1024], layer["o"], "o")
            gate_up = linear(o, layer["gate_up"], "gate_up")
            h = linear(gate_up[:, :3072], layer["down"], "down")
        return h

    best, median, out = time_graph(run)
    return best / len(layers), median / len(layers), out.clone()


SWEEP = dict(block_m=(16, 32, 64), block_n=(16, 32, 64), block_k=(128, 256), warps=(4, 8), stages=(3, 5), splits=(1,))
"""``--sweep``'s grid: every combination that tiles the projection. ``splits`` > 1: `triton_linear.skinny_partials`
(fp32 partials, not added up: the lean runner adds them inside its next fused kernel), not for gate/up."""
SWEEP_BYTES = 200e6  # each sweep chain cycles over weight copies this large: no call finds its weight in L2


def _configs(grid: dict[str, tuple[int, ...]], n: int, k: int, rows: int, glu: bool) -> list[tuple]:
    """(tile, splits) of ``grid`` that tile an ``[n, k]`` projection of ``rows`` rows."""
    import itertools

    from relax.backends.embedded import triton_linear

    out = []
    for combo in itertools.product(*grid.values()):
        axes = dict(zip(grid, combo, strict=True))
        splits = axes.pop("splits")
        tile = triton_linear.Tile(**axes)
        if n % tile.block_n or k % (tile.block_k * splits) or (splits > 1 and (glu or rows > tile.block_m)):
            continue
        out.append((tile, splits))
    return out


def sweep(rows: int, budget_s: float, emit, grid: dict[str, tuple[int, ...]] = SWEEP,
          shapes: tuple[str, ...] = tuple(SWEEP_SHAPES)) -> None:
    """Each projection of ``shapes`` (`SWEEP_SHAPES`) alone, chained over weight copies (``--sweep``): cuBLAS, then
    every `SWEEP` config with PDL, as microseconds per call, the lean runner's default tile marked; ``emit(rows)``
    after each projection (a run cut short keeps what it measured). gate/up runs with ``glu`` (its output is the
    I = 3072 columns of ``silu(gate) * up``; cuBLAS's row applies them with torch ops). ``grid``: `SWEEP` with some of
    its axes replaced (``--grid``)."""
    import time

    import torch

    from relax.backends.embedded import triton_linear
    from relax.backends.embedded.sm_count import sm_count

    sms, started, out = sm_count(torch.device("cuda")), time.perf_counter(), []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name in shapes:
        n_w, k = SWEEP_SHAPES[name]
        glu = name == "gate_up"
        n = n_w // 2 if glu else n_w
        copies = max(16, int(SWEEP_BYTES // (n_w * k * 2)) + 1)
        weights = [(torch.randn(n_w, k, generator=gen, device="cuda") / k ** 0.5).bfloat16() for _ in range(copies)]
        x = torch.randn(rows, k, generator=gen, device="cuda").bfloat16()
        default = (triton_linear.default_tile(n, sms), 1)

        def cublas(weights=weights, x=x, glu=glu):
            for w in weights:
                out = torch.nn.functional.linear(x, w)
                if glu:
                    gate, up = out.chunk(2, -1)
                    torch.nn.functional.silu(gate) * up

        _, median, _ = time_graph(cublas)
        out.append(dict(projection=name, cublas=True, default=False, us=median / len(weights)))
        for tile, splits in sorted({default, *_configs(grid, n, k, rows, glu)}, key=lambda c: c != default):
            if time.perf_counter() - started > budget_s:
                emit(out)
                return

            def run(tile=tile, splits=splits, weights=weights, x=x, glu=glu):
                for w in weights:
                    if splits > 1:
                        triton_linear.skinny_partials(x, w, None, splits, pdl=True, tile=tile)
                    else:
                        triton_linear.skinny_linear(x, w, glu=glu, pdl=True, tile=tile)

            row = dict(projection=name, **vars(tile), splits=splits, default=(tile, splits) == default)
            try:
                _, median, _ = time_graph(run)
            except Exception as exc:  # noqa: BLE001 - a config Triton cannot build (registers, shared memory) is a row
                out.append(row | dict(error=str(exc)[:120]))
                continue
            out.append(row | dict(us=median / len(weights)))
        mine = [r for r in out if r["projection"] == name and "us" in r and not r.get("cublas")]
        best = min(mine, key=lambda r: r["us"])
        base = next(r for r in mine if r["default"])
        blas = next(r for r in out if r["projection"] == name and r.get("cublas"))
        print(f"{name:8s} cuBLAS {blas['us']:6.2f} us; default {base['us']:6.2f} us; best {best['us']:6.2f} us "
              f"({ {k: best[k] for k in SWEEP} }), {base['us'] / best['us']:.2f}x", flush=True)
        emit(out)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64, help="decode batch rows (the skinny kernel serves <= 64)")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sweep", action="store_true",
                    help="instead of the chain: each projection alone over the SWEEP grid of tiles (with PDL)")
    ap.add_argument("--budget-s", type=float, default=480, help="--sweep stops starting tiles after this long")
    ap.add_argument("--grid", nargs="+", default=[], metavar="AXIS=V1,V2",
                    help=f"--sweep: replace axes of the grid, e.g. stages=5,6,8 (axes: {', '.join(SWEEP)})")
    ap.add_argument("--shapes", nargs="+", default=list(SWEEP_SHAPES), choices=list(SWEEP_SHAPES),
                    help="--sweep: these projections only")
    ns = ap.parse_args()

    import torch

    from relax.backends.embedded.pdl import pdl_available

    if not torch.cuda.is_available():
        sys.exit("bench_decode_linear: needs a CUDA GPU; tests/test_decode_linear.py checks the kernel on CPU under "
                 "TRITON_INTERPRET=1")
    if not pdl_available(torch.device("cuda")):
        sys.exit("bench_decode_linear: needs a GPU of compute capability 9+ and a Triton with gdc_wait (PDL)")
    def write(rows: list[dict]) -> None:
        if ns.json:
            ns.json.parent.mkdir(parents=True, exist_ok=True)
            ns.json.write_text(json.dumps({"provenance": provenance(), "setup": vars(ns) | {"json": str(ns.json)},
                                           "device": torch.cuda.get_device_name(), "rows": rows}, indent=1))

    if ns.sweep:
        grid = dict(SWEEP)
        for item in ns.grid:
            axis, _, values = item.partition("=")
            if axis not in SWEEP or not values:
                sys.exit(f"bench_decode_linear: --grid {item!r}: want AXIS=V1,V2 with AXIS one of {', '.join(SWEEP)}")
            grid[axis] = tuple(int(v) for v in values.split(","))
        sweep(ns.rows, ns.budget_s, write, grid, tuple(ns.shapes))
        return
    gen = torch.Generator(device="cuda").manual_seed(0)
    layers = [{nm: (torch.randn(n, k, generator=gen, device="cuda") / k ** 0.5).bfloat16()
               for nm, (n, k) in SHAPES.items()} for _ in range(ns.layers)]
    x0 = torch.randn(ns.rows, 1024, generator=gen, device="cuda").bfloat16()
    rows, reference = [], None
    for name, linear in variants(ns.rows).items():
        best, median, out = time_chain(linear, layers, x0)
        reference = out.double() if reference is None else reference
        row = dict(variant=name, us_per_layer_best=best, us_per_layer_median=median,
                   rel_diff_vs_cublas=float((out.double() - reference).abs().max() / reference.abs().max()))
        rows.append(row)
    for row in rows:
        row["speedup_vs_cublas"] = rows[0]["us_per_layer_best"] / row["us_per_layer_best"]
        print(f"{row['variant']:11s} {row['us_per_layer_best']:6.2f} us per layer (median {row['us_per_layer_median']:6.2f}), "
              f"{row['speedup_vs_cublas']:.2f}x cuBLAS, rel. diff {row['rel_diff_vs_cublas']:.1e}", flush=True)
    write(rows)


if __name__ == "__main__":
    main()
