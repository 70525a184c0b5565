"""Decode attention alone: the Triton flash-decoding kernel (per config) against the grouped baddbmm reference.

    python ci/bench_decode_attention.py [--rows 64 256] [--positions 128 256 383] [--rope] --json out.json

Shapes are bench-270m's (16 query heads, 8 KV heads, head dim 64, bf16, cache length 392, view
bucket 384), every row at the same cache position. Each variant is timed as a CUDA graph of
``--calls`` back-to-back calls (the engine replays it inside its decode graph, so Python launch
cost does not count), the calls cycling over copies of the caches that together exceed 200 MB,
so that no call finds its K/V in the 50 MB L2 (a first version reused one copy and read "104% of
HBM"; docs/results/bench_decode_attention_h100_l2warm.json is that run), and reported as microseconds per call, the HBM bandwidth it reaches on the
K/V bytes it must read, and its speed-up over the reference in the same run. The default config
(`triton_decode.BLOCK_N`, 4 warps, `split_count`) is marked. ``--rope`` gives the kernel the raw projection, as
the lean runner's compiled decode does (the kernel applies q/k-norm and RoPE; more registers and a longer prologue
per program), so a config's standing here is the one it has in the engine.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from ci.provenance import provenance  # noqa: E402

HEADS, KV_HEADS, DIM, MAX_LEN, VIEW = 16, 8, 64, 392, 384
L2_FLUSH_BYTES = 200_000_000  # 4x the H100's (and H200's) 50 MB L2


def graph_us(fns: list, calls: int) -> float:
    """Microseconds per call of a CUDA graph of ``calls`` calls, call ``i`` being ``fns[i % len(fns)]``."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fns[0]()  # compile / warm up outside the graph
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fns[i % len(fns)]()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1000 / (5 * calls)


def rope_inputs(dim: int, length: int, gen) -> tuple:
    """The lean runner's operands for the kernel's own q/k-norm and RoPE: ``[length, dim]`` cos and sign-folded sin
    tables (base 10000), q/k-norm weights near 1, eps 1e-6 (bench-270m is Qwen3: it has q/k-norm)."""
    import torch

    from relax.backends.embedded.norm_rope import sign_folded

    angles = torch.arange(length, device="cuda")[:, None] * (
        1.0 / 10000 ** (torch.arange(dim // 2, device="cuda") / (dim // 2)))[None, :]
    angles = torch.cat([angles, angles], -1)
    norms = (1 + torch.randn(2, dim, generator=gen, device="cuda") / 8).bfloat16()
    return angles.cos().bfloat16(), sign_folded(angles.sin()).bfloat16(), norms[0], norms[1], 1e-6


def measure_shape(n: int, pos: int, calls: int, tbps: float, rope: bool = False) -> list[dict]:
    """Every variant at ``n`` rows, all at cache position ``pos``; with ``rope`` the kernel takes the raw projection
    and applies q/k-norm and RoPE itself, as in the lean runner's compiled decode (the reference runs
    `prepare_qk` first, inside its timing)."""
    import torch

    from relax.backends.embedded import triton_decode
    from relax.backends.embedded.decode_attention import prepare_qk, reference_decode_attention

    gen = torch.Generator(device="cuda").manual_seed(n + pos)
    qk, vn = (torch.randn(*s, generator=gen, device="cuda").bfloat16() for s in ((n, HEADS + KV_HEADS, DIM),
                                                                              (n, KV_HEADS, DIM)))
    set_bytes = 2 * n * KV_HEADS * MAX_LEN * DIM * 2
    caches = [tuple(torch.randn(n, KV_HEADS, MAX_LEN, DIM, generator=gen, device="cuda").bfloat16() for _ in range(2))
              for _ in range(max(2, -(-L2_FLUSH_BYTES // set_bytes)))]
    positions = torch.full((n,), pos, device="cuda")
    kv_bytes = 2 * n * KV_HEADS * (pos + 1) * DIM * 2
    tables = rope_inputs(DIM, MAX_LEN, gen) if rope else None

    def prepared() -> torch.Tensor:
        return prepare_qk(qk, positions, *tables, KV_HEADS) if rope else qk

    ref_us = graph_us([lambda kc=kc, vc=vc: reference_decode_attention(prepared(), vn, kc, vc, positions, 0.125, VIEW)
                       for kc, vc in caches], calls)
    kc, vc = caches[0]
    expected = reference_decode_attention(prepared().double(), vn.double(), kc.double(), vc.double(), positions, 0.125,
                                          VIEW)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = (triton_decode.BLOCK_N, 4, triton_decode.split_count(n, KV_HEADS, VIEW, sms))
    out = []
    for block_n, warps, splits in sorted({default, *itertools.product([32, 64, 128], [2, 4, 8], [1, 2, 4])}):
        calls_of = [lambda kc=kc, vc=vc, block_n=block_n, warps=warps, splits=splits: triton_decode.decode_attention(
            qk, vn, kc, vc, positions, 0.125, VIEW, rope=tables, splits=splits, block_n=block_n, num_warps=warps)
            for kc, vc in caches]
        err = float((calls_of[0]().double() - expected).abs().max())
        us = graph_us(calls_of, calls)
        out.append(dict(rows=n, position=pos, rope=rope, block_n=block_n, num_warps=warps, splits=splits,
                        default=(block_n, warps, splits) == default, us=us, reference_us=ref_us, speedup=ref_us / us,
                        hbm_share=kv_bytes / (us * 1e-6) / (tbps * 1e12), max_err=err))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--positions", type=int, nargs="+", default=[128, 256, 383])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rope", action="store_true",
                    help="the kernel applies q/k-norm and RoPE to the raw projection (the lean runner's compiled decode)")
    ap.add_argument("--json", type=Path)
    ns = ap.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("bench_decode_attention: needs a CUDA GPU (it times the Triton kernel); "
                 "tests/test_decode_attention.py checks the kernel on CPU under TRITON_INTERPRET=1")
    tbps = 3.35 if "H100" in torch.cuda.get_device_name() else 4.8
    rows_out = []
    for n, pos in itertools.product(ns.rows, ns.positions):
        shape = measure_shape(n, pos, ns.calls, tbps, ns.rope)
        rows_out += shape
        best = min(shape, key=lambda r: r["us"])
        mine = next(r for r in shape if r["default"])
        print(f"rows {n:4d} position {pos:4d}: reference {mine['reference_us']:7.1f} us | default {mine['us']:6.1f} us "
              f"({mine['speedup']:.2f}x, {mine['hbm_share']:.0%} of HBM, max err {mine['max_err']:.1e}) | best "
              f"{best['us']:6.1f} us (block {best['block_n']}, {best['num_warps']} warps, {best['splits']} splits, "
              f"{best['hbm_share']:.0%})", flush=True)
    if ns.json:
        ns.json.parent.mkdir(parents=True, exist_ok=True)
        ns.json.write_text(json.dumps({"provenance": provenance(), "setup": vars(ns) | {"json": str(ns.json)},
                                       "hbm_tbps": tbps, "rows": rows_out}, indent=1))


if __name__ == "__main__":
    main()
