"""The fused decode projection (norm -> linear -> SiLU product / residual) against float64, under
torch.compile, and its Triton kernel under the interpreter.

The Triton kernel runs here under ``TRITON_INTERPRET=1`` (CPU tensors, numpy), in a subprocess
because the interpreter is chosen when ``triton.jit`` decorates. fp16 only: the interpreter's
bf16 loads are wrong (tests/test_engine_gpu.py checks bf16 on the GPU).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.embedded.fused_linear import fused_linear, reference_fused_linear

ROOT = Path(__file__).resolve().parents[1]


def naive(x, weight, norm_weight, bias, residual, eps, gated):
    """float64 by the formulas, one output element at a time for the products."""
    x, weight = x.double(), weight.double()
    if norm_weight is not None:
        x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * norm_weight.double()
    n = weight.shape[0] // (2 if gated else 1)
    y = torch.stack([(x * weight[j]).sum(-1) for j in range(weight.shape[0])], -1)
    if bias is not None:
        y = y + bias.double()
    if gated:
        gate, up = y[..., :n], y[..., n:]
        y = gate / (1 + torch.exp(-gate)) * up
    return y if residual is None else y + residual.double()


def case(m, k, n, *, norm, gated, bias, residual, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    rows = 2 * n if gated else n
    return (rand(m, k), rand(rows, k) / k ** 0.5, (1 + 0.1 * rand(k)) if norm else None,
            rand(n) if bias and not gated else None, rand(m, n) if residual else None, 1e-6, gated)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 24), n=st.integers(1, 9), norm=st.booleans(), gated=st.booleans(),
       bias=st.booleans(), residual=st.booleans(), seed=st.integers(0, 10_000))
def test_reference_matches_float64_formulas(m, k, n, norm, gated, bias, residual, seed) -> None:
    args = case(m, k, n, norm=norm, gated=gated, bias=bias, residual=residual, seed=seed)
    out = reference_fused_linear(*args)
    assert out.shape == (m, n)
    assert (out.double() - naive(*args)).abs().max() < 1e-4


def test_gated_projection_with_a_bias_is_refused() -> None:
    x, w = torch.randn(2, 8), torch.randn(6, 8)
    with pytest.raises(ValueError, match="gated .* with a bias is not supported"):
        reference_fused_linear(x, w, None, torch.randn(6), None, 1e-6, True)


def test_op_under_torch_compile_matches_eager() -> None:
    args = case(5, 32, 12, norm=True, gated=True, bias=False, residual=False, seed=3)
    res = case(5, 12, 32, norm=False, gated=False, bias=True, residual=True, seed=4)

    def mlp(x, w, nw, w_down, b_down, r):
        h = fused_linear(x * 1.0, w, nw, None, None, 1e-6, True)
        return fused_linear(h, w_down, None, b_down, r, 1e-6, False) + 0.0

    inputs = (args[0], args[1], args[2], res[1], res[3], torch.randn(5, 32))
    compiled = torch.compile(mlp, dynamic=True, fullgraph=True)(*inputs)
    assert torch.equal(compiled, mlp(*inputs))


_TRITON_CHECK = textwrap.dedent("""
    import itertools, json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from tests.test_fused_linear import case, naive
    from relax.backends.embedded import triton_linear
    results = []
    # rows 1 / 5 / 64 (BLOCK_M 16 and 64), N not a multiple of BLOCK_N, K not a multiple of BLOCK_K, every flag
    shapes = [(1, 64, 40), (5, 96, 24), (64, 64, 48)]
    configs = [dict(BLOCK_N=16, BLOCK_K=64, num_warps=4, num_stages=2), dict(BLOCK_N=32, BLOCK_K=32, num_warps=2,
                                                                            num_stages=3)]
    for (m, k, n), (norm, gated, bias, residual), config in itertools.product(
            shapes, [(False, False, False, False), (True, False, True, False), (True, True, False, False),
                     (False, False, True, True), (False, False, False, True)], configs):
        args = case(m, k, n, norm=norm, gated=gated, bias=bias, residual=residual, seed=m * 1000 + k + n,
                    dtype=torch.float16)
        expected = naive(*args)
        out = triton_linear.launch(*args, config=config)
        results.append(dict(case=[m, k, n, norm, gated, bias, residual, config["BLOCK_N"]],
                            shape=list(out.shape), dtype=str(out.dtype),
                            err=float(((out.double() - expected).abs().max() / expected.abs().max()))))
    print("RESULT " + json.dumps(results))
""")


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="triton not installed (dev extra)")
def test_triton_kernel_matches_float64_in_the_interpreter() -> None:
    env = dict(os.environ, TRITON_INTERPRET="1")
    proc = subprocess.run([sys.executable, "-c", _TRITON_CHECK, str(ROOT)], capture_output=True, text=True, env=env,
                          timeout=600, cwd=ROOT)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    results = json.loads(lines[0][len("RESULT "):])
    assert len(results) == 30
    for r in results:
        assert r["shape"] == r["case"][:1] + r["case"][2:3] and r["dtype"] == "torch.float16", r
        # fp16 inputs, fp32 accumulation, fp16 rounding of each op's result (as the unfused ops round)
        assert r["err"] < 4e-3, r
