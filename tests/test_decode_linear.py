"""The decode projection op (relax/backends/embedded/decode_linear.py) and its Triton skinny GEMM
(triton_linear.py) against float64, PDL's availability rule, and the torch.compile options it implies.

The kernel runs here under ``TRITON_INTERPRET=1`` (CPU tensors, numpy) in a subprocess, without PDL (the
interpreter has no grid dependencies); fp16 only, as the interpreter's ``tl.dot`` has no bf16. On the GPU,
tests/test_engine_gpu.py runs it with PDL inside the lean runner's compiled CUDA graphs.
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.embedded import pdl
from relax.backends.embedded.decode_linear import decode_linear
from tests.triton_helpers import needs_triton, run_interpreted


def test_the_op_is_f_linear_on_cpu_and_one_opaque_call_under_compile() -> None:
    gen = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=gen) for s in ((5, 32), (48, 32), (48,)))
    assert torch.equal(decode_linear(x, w, b), F.linear(x, w, b))
    assert torch.equal(decode_linear(x, w), F.linear(x, w))
    compiled = torch.compile(lambda x: decode_linear(x * 2.0, w, b) + 1.0, dynamic=True)
    torch.testing.assert_close(compiled(x), F.linear(x * 2.0, w, b) + 1.0)


_KERNEL_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from relax.backends.embedded import triton_linear
    results = []
    gen = torch.Generator().manual_seed(0)
    # (rows, N, K, bias, SMs): one row, a partial row block, a full one, two row blocks; each column tile width
    for m, n, k, bias, sms in [(1, 64, 128, False, 2), (7, 48, 256, True, 132), (64, 256, 128, False, 132),
                               (64, 96, 384, True, 6), (65, 32, 128, True, 132)]:
        triton_linear.sm_count = lambda device, sms=sms: sms
        x = (torch.randn(m, k, generator=gen) / 4).half()
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).half()
        b = torch.randn(n, generator=gen).half() if bias else None
        expected = x.double() @ w.double().T + (b.double() if bias else 0)
        out = triton_linear.skinny_linear(x, w, b, pdl=False)
        results.append(dict(case=[m, n, k, bias, sms], block_n=triton_linear.block_n(n, sms),
                            supported=triton_linear.supports(x, w), shape=list(out.shape), dtype=str(out.dtype),
                            err=float((out.double() - expected).abs().max()),
                            scale=float(expected.abs().max())))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
def test_skinny_kernel_matches_float64_in_the_interpreter() -> None:
    results = run_interpreted(_KERNEL_CHECK)
    assert {r["block_n"] for r in results} == {64, 32, 16}, results  # every column tile width ran
    for r in results:
        m, n = r["case"][:2]
        assert r["shape"] == [m, n] and r["dtype"] == "torch.float16", r
        assert r["supported"] == (m <= 64), r  # 65 rows: the op leaves it to F.linear (the kernel still tiles it)
        assert r["err"] < 2e-3 * max(1.0, r["scale"]), r  # fp32 accumulation, one fp16 rounding of the output


_GLU_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from relax.backends.embedded import triton_linear
    results = []
    from tests.triton_helpers import refusal
    gen = torch.Generator().manual_seed(3)
    for m, i, k in [(1, 32, 128), (9, 48, 256), (64, 64, 128)]:  # (rows, I, K): gate/up weight [2I, K]
        x = (torch.randn(m, k, generator=gen) / 2).half()
        w = (torch.randn(2 * i, k, generator=gen) / k ** 0.5).half()
        gate, up = (x.double() @ w.double().T).chunk(2, -1)
        expected = torch.nn.functional.silu(gate) * up
        out = triton_linear.skinny_linear(x, w, glu=True, pdl=False)
        results.append(dict(case=[m, i, k], shape=list(out.shape), supported=triton_linear.supports(x, w, glu=True),
                            err=float((out.double() - expected).abs().max()), scale=float(expected.abs().max())))
    results.append(refusal(lambda: triton_linear.skinny_linear(x, w, torch.zeros(2 * i).half(), glu=True, pdl=False)))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
def test_gate_up_kernel_applies_silu_gate_times_up_like_float64_in_the_interpreter() -> None:
    *results, refusal = run_interpreted(_GLU_CHECK)
    assert "glu takes no bias" in refusal
    for r in results:
        m, i = r["case"][:2]
        assert r["shape"] == [m, i] and r["supported"], r
        # fp32 sums, the gate and up rounded to fp16 as the two projections are, the product rounded once
        assert r["err"] < 3e-3 * max(1.0, r["scale"]), r


_PARTIALS_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from relax.backends.embedded import triton_linear
    results = []
    from tests.triton_helpers import refusal
    gen = torch.Generator().manual_seed(5)
    # (rows, N, K, splits, bias): one row, a partial row block, a full one; 2, 4 and 8 K ranges
    for m, n, k, splits, bias in [(1, 64, 256, 2, False), (7, 32, 512, 4, True), (64, 96, 1024, 8, True)]:
        x = (torch.randn(m, k, generator=gen) / 4).half()
        w = (torch.randn(n, k, generator=gen) / k ** 0.5).half()
        b = torch.randn(n, generator=gen).half() if bias else None
        parts = triton_linear.skinny_partials(x, w, b, splits, pdl=False)
        step = k // splits
        expected = torch.stack([x[:, s * step:(s + 1) * step].double() @ w[:, s * step:(s + 1) * step].double().T
                                for s in range(splits)])
        if bias:
            expected[0] += b.double()
        results.append(dict(case=[m, n, k, splits, bias], shape=list(parts.shape), dtype=str(parts.dtype),
                            err=float((parts.double() - expected).abs().max()), scale=float(expected.abs().max())))
    results.append(refusal(lambda: triton_linear.skinny_partials(torch.zeros(65, 256).half(), torch.zeros(32, 256).half(),
                                                                 None, 2, pdl=False)))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
def test_split_k_kernel_writes_each_k_range_partial_like_float64_in_the_interpreter() -> None:
    *results, refusal = run_interpreted(_PARTIALS_CHECK)
    assert refusal.startswith("skinny_partials: 65 rows, N 32, K 256 do not take 2 splits"), refusal
    for r in results:
        m, n, k, splits, _ = r["case"]
        assert r["shape"] == [splits, m, n] and r["dtype"] == "torch.float32", r
        assert r["err"] < 1e-5 * max(1.0, r["scale"]), r  # fp32 sums of fp16 products: no output rounding


def test_partials_op_on_cpu_adds_up_to_the_projection_and_keeps_its_shape_under_compile() -> None:
    from relax.backends.embedded.decode_linear import add_partials, decode_linear_partials, partial_splits

    gen = torch.Generator().manual_seed(6)
    x, w, b = (torch.randn(*s, generator=gen, dtype=torch.float64) for s in ((5, 64), (48, 64), (48,)))
    parts = decode_linear_partials(x, w, b, 4)
    assert parts.shape == (4, 5, 48) and parts.dtype == torch.float32
    for s in range(4):  # each K range's product, the bias in the first only
        want = x[:, 16 * s:16 * (s + 1)].float() @ w[:, 16 * s:16 * (s + 1)].float().T + (b.float() if s == 0 else 0)
        torch.testing.assert_close(parts[s], want)
    summed = add_partials(parts, torch.float64)
    assert summed.dtype == torch.float64
    assert torch.equal(summed, (((parts[0] + parts[1]) + parts[2]) + parts[3]).double())  # in split order
    torch.testing.assert_close(summed, F.linear(x, w, b), rtol=1e-5, atol=1e-5)
    compiled = torch.compile(lambda x: add_partials(decode_linear_partials(x, w.float(), None, 2), torch.float32) + 1.0,
                             dynamic=True)
    torch.testing.assert_close(compiled(x.float()), F.linear(x.float(), w.float()) + 1.0)
    assert partial_splits(w.float()) == 1  # CPU: the lean runner keeps one projection


@needs_triton
def test_partial_rows_is_the_kernels_row_block() -> None:
    from relax.backends.embedded import triton_linear
    from relax.backends.embedded.decode_linear import PARTIAL_ROWS

    assert PARTIAL_ROWS == triton_linear.BLOCK_M


@needs_triton
@settings(max_examples=80, deadline=None)
@given(n=st.sampled_from([32, 96, 1024, 2048, 40]), k=st.sampled_from([128, 256, 384, 1024, 3072, 200]),
       sms=st.integers(1, 200))
def test_split_count_fills_the_sms_without_oversubscribing_them(n, k, sms) -> None:
    from relax.backends.embedded.triton_linear import BLOCK_K, SPLIT_BLOCK_N, split_count

    s = split_count(n, k, sms)
    assert s in (1, 2, 4, 8)
    if s > 1:
        assert n % SPLIT_BLOCK_N == 0 and k % (s * BLOCK_K) == 0 and n // SPLIT_BLOCK_N * s <= sms
    if n % SPLIT_BLOCK_N == 0 and s < 8 and k % (2 * s * BLOCK_K) == 0:
        assert n // SPLIT_BLOCK_N * 2 * s > sms  # twice the splits would have oversubscribed the SMs
    if (n, k, sms) == (1024, 3072, 132):
        assert s == 4  # bench-270m's down projection on the H100: 128 programs
    if (n, k, sms) == (1024, 1024, 132):
        assert s == 4  # its o projection


def test_glu_op_on_cpu_is_the_two_projections_then_silu_gate_times_up() -> None:
    from relax.backends.embedded.decode_linear import glu_rows

    gen = torch.Generator().manual_seed(4)
    x, w = torch.randn(5, 32, generator=gen), torch.randn(96, 32, generator=gen)
    gate, up = F.linear(x, w).chunk(2, -1)
    assert torch.equal(decode_linear(x, w, None, True), F.silu(gate) * up)
    compiled = torch.compile(lambda x: decode_linear(x, w, None, True) * 2.0, dynamic=True)
    torch.testing.assert_close(compiled(x), F.silu(gate) * up * 2.0)  # the fake kernel's shape: [5, 48]
    assert glu_rows(w) == 0  # CPU: the lean runner keeps silu(gate) * up outside the op


@needs_triton
def test_supports_glu_needs_halves_the_column_tile_divides() -> None:
    from relax.backends.embedded.triton_linear import supports

    h = torch.float16
    x = torch.zeros(64, 256, dtype=h)
    assert supports(x, torch.zeros(96, 256, dtype=h), glu=True)  # halves of 48
    assert not supports(x, torch.zeros(48, 256, dtype=h), glu=True)  # halves of 24: no tile divides them
    assert not supports(x, torch.zeros(33, 256, dtype=h), glu=True)


@needs_triton
@settings(max_examples=60, deadline=None)
@given(n=st.sampled_from([16, 48, 96, 1024, 2048, 6144, 32000, 40]), sms=st.integers(1, 200))
def test_column_tile_tiles_n_and_prefers_wide_tiles_that_still_spread(n, sms) -> None:
    from relax.backends.embedded.triton_linear import block_n

    b = block_n(n, sms)
    if n % 16:
        assert b is None
        return
    fitting = [w for w in (64, 32, 16) if n % w == 0]
    assert b in fitting
    assert all(n // w < sms // 2 for w in fitting if w > b)  # a wider tile would have left over half the SMs idle
    if n // b < sms // 2:
        assert b == min(fitting)  # none spreads: the narrowest, the most programs


@needs_triton
def test_supports_only_what_the_kernel_tiles() -> None:
    from relax.backends.embedded.triton_linear import supports

    h = torch.float16
    ok = (torch.zeros(64, 256, dtype=h), torch.zeros(48, 256, dtype=h))
    assert supports(*ok)
    assert not supports(torch.zeros(65, 256, dtype=h), ok[1])  # past MAX_ROWS: cuBLAS
    assert not supports(torch.zeros(0, 256, dtype=h), ok[1])
    assert not supports(torch.zeros(8, 200, dtype=h), torch.zeros(48, 200, dtype=h))  # K not a multiple of 128
    assert not supports(ok[0], torch.zeros(40, 256, dtype=h))  # N not a multiple of 16
    assert not supports(ok[0].float(), ok[1].float())  # fp32: F.linear
    assert not supports(torch.zeros(8, 512, dtype=h)[:, ::2], ok[1])  # strided K
    assert not supports(ok[0], torch.zeros(48, 128, dtype=h))  # K mismatch


def test_pdl_needs_hopper_and_can_be_turned_off(monkeypatch) -> None:
    pdl.pdl_available.cache_clear()
    assert not pdl.pdl_available(torch.device("cpu"))
    assert pdl.compile_options(torch.device("cpu"), None) == {"mode": None}
    assert pdl.compile_options(torch.device("cpu"), "max-autotune") == {"mode": "max-autotune"}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    pdl.pdl_available.cache_clear()
    has_gdc = pytest.importorskip("triton") is not None
    try:
        from triton.language.extra.cuda import gdc_wait  # noqa: F401
    except ImportError:
        has_gdc = False
    cuda = torch.device("cuda", 0)
    assert pdl.pdl_available(cuda) == has_gdc
    if has_gdc:
        assert pdl.compile_options(cuda, None) == {"options": {"triton.enable_pdl": True}}
        assert pdl.compile_options(cuda, "max-autotune") == {"mode": "max-autotune"}  # a mode or options, not both
    monkeypatch.setenv("RELAX_DECODE_PDL", "0")
    pdl.pdl_available.cache_clear()
    assert not pdl.pdl_available(cuda)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    monkeypatch.delenv("RELAX_DECODE_PDL")
    pdl.pdl_available.cache_clear()
    assert not pdl.pdl_available(cuda)  # Ampere: no PDL
    pdl.pdl_available.cache_clear()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_linear_bench_says_in_one_line_that_it_needs_a_gpu() -> None:
    import subprocess
    import sys

    from tests.triton_helpers import ROOT

    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "bench_decode_linear.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [
        "bench_decode_linear: needs a CUDA GPU; tests/test_decode_linear.py checks the kernel on CPU under "
        "TRITON_INTERPRET=1"]
