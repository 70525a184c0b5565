"""The decode-attention op against a float64 per-row reference, under torch.compile, and its Triton kernel.

The Triton kernel runs here under ``TRITON_INTERPRET=1`` (CPU tensors, numpy), in a subprocess
because the interpreter is chosen when ``triton.jit`` decorates. fp16 only: the interpreter's
bf16 loads are wrong (tests/test_engine_gpu.py checks bf16 on the GPU, where it runs compiled).
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.embedded.decode_attention import decode_attention, reference_decode_attention
from relax.backends.embedded.norm_rope import sign_folded
from tests.triton_helpers import needs_triton, run_interpreted

ROOT = Path(__file__).resolve().parents[1]


def naive(qk, v_new, k_cache, v_cache, positions, scale, prefix_rows=None, prefix_lens=None):
    """float64, one (row, head) at a time: the row's cache ``[:pos]`` plus its new K/V; with shared prompts, the
    positions before ``prefix_lens[b]`` from slot ``prefix_rows[b]``."""
    kvh = k_cache.shape[1]
    n, heads = qk.shape[0], qk.shape[1] - kvh
    q, k_new = qk[:, :heads], qk[:, heads:]
    group = heads // kvh
    out = torch.empty(q.shape, dtype=torch.float64)
    for b in range(n):
        pos = int(positions[b])
        src, shared = (b, 0) if prefix_rows is None else (int(prefix_rows[b]), min(int(prefix_lens[b]), pos))
        for h in range(heads):
            kv = h // group
            keys = torch.cat([k_cache[src, kv, :shared].double(), k_cache[b, kv, shared:pos].double(),
                              k_new[b, kv, None].double()])
            values = torch.cat([v_cache[src, kv, :shared].double(), v_cache[b, kv, shared:pos].double(),
                                v_new[b, kv, None].double()])
            probs = torch.softmax(keys @ q[b, h].double() * scale, dim=0)
            out[b, h] = probs @ values
    return out


def _inputs(n, heads, kvh, dim, max_len, view, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    rand = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    positions = torch.randint(0, view, (n,), generator=gen)
    positions[0] = view - 1  # one row at the bound
    return rand(n, heads + kvh, dim), rand(n, kvh, dim), rand(n + 1, kvh, max_len, dim), rand(n + 1, kvh, max_len, dim), \
        positions


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), kvh=st.sampled_from([1, 2, 4]), group=st.sampled_from([1, 2, 3]),
       dim=st.sampled_from([4, 8]), view=st.integers(1, 40), seed=st.integers(0, 10_000))
def test_reference_matches_float64_per_row_attention_and_writes_the_new_kv(n, kvh, group, dim, view, seed) -> None:
    qk, vn, kc, vc, pos = _inputs(n, kvh * group, kvh, dim, 48, view, seed)
    kn = qk[:, kvh * group:]
    before_k, before_v = kc.clone(), vc.clone()
    expected = naive(qk, vn, kc, vc, pos, 0.3)
    out = reference_decode_attention(qk, vn, kc, vc, pos, 0.3, view)
    assert (out.double() - expected).abs().max() < 1e-5
    rows = torch.arange(n)
    assert torch.equal(kc[rows, :, pos], kn) and torch.equal(vc[rows, :, pos], vn)
    kc[rows, :, pos], vc[rows, :, pos] = before_k[rows, :, pos], before_v[rows, :, pos]
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)  # nothing else written


def _shared_prompts(n: int, positions: torch.Tensor, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row reads its first positions from a random other row (or itself): at most as far as its own position
    and the other row's (a shared prompt precedes both rows' new tokens, so no row reads what this step writes)."""
    gen = torch.Generator().manual_seed(seed)
    rows = torch.randint(0, n, (n,), generator=gen)
    lens = (torch.rand(n, generator=gen) * (positions + 1).float()).long()
    return rows, torch.minimum(lens, positions[rows])


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 5), kvh=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]), view=st.integers(1, 40),
       seed=st.integers(0, 10_000))
def test_shared_prompts_read_their_prefix_from_the_other_slot_and_write_their_own(n, kvh, group, view, seed) -> None:
    qk, vn, kc, vc, pos = _inputs(n, kvh * group, kvh, 8, 48, view, seed)
    rows, lens = _shared_prompts(n, pos, seed)
    before_k, before_v = kc.clone(), vc.clone()
    expected = naive(qk, vn, kc, vc, pos, 0.3, rows, lens)
    out = reference_decode_attention(qk, vn, kc, vc, pos, 0.3, view, rows, lens)
    assert (out.double() - expected).abs().max() < 1e-5
    own = torch.arange(n)
    assert torch.equal(kc[own, :, pos], qk[:, kvh * group:]) and torch.equal(vc[own, :, pos], vn)
    kc[own, :, pos], vc[own, :, pos] = before_k[own, :, pos], before_v[own, :, pos]
    assert torch.equal(kc, before_k) and torch.equal(vc, before_v)  # the shared slots are only read
    op = decode_attention(qk, vn, kc, vc, pos, 0.3, view, rows, lens)
    assert torch.equal(op, out)


def test_op_under_torch_compile_mutates_the_caches_in_place_and_matches_eager() -> None:
    qk, vn, kc, vc, pos = _inputs(3, 4, 2, 8, 32, 20, seed=1)
    kc2, vc2 = kc.clone(), vc.clone()
    ptrs = (kc.data_ptr(), vc.data_ptr())

    def step(qk, vn, kc, vc, pos, view):
        return decode_attention(qk * 1.0, vn, kc, vc, pos, 0.25, view) + 0.0

    out = torch.compile(step, dynamic=True, fullgraph=True)(qk, vn, kc, vc, pos, 20)
    eager = step(qk, vn, kc2, vc2, pos, 20)
    assert torch.equal(out, eager)
    assert (kc.data_ptr(), vc.data_ptr()) == ptrs
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)


def _rope_tables(dim: int, length: int, dtype=torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The lean runner's RoPE tables (``sin`` with the rotate-half sign folded in) and HF's unsigned ``sin``."""
    angles = torch.arange(length)[:, None] * (1.0 / 10000 ** (torch.arange(dim // 2) / (dim // 2)))[None, :]
    angles = torch.cat([angles, angles], -1)
    return angles.cos().to(dtype), sign_folded(angles.sin().to(dtype)), angles.sin().to(dtype)


def test_prepare_qk_and_the_lean_runners_eager_norm_and_rope_are_bitwise_hfs() -> None:
    """What the kernel's fused q/k-norm + RoPE must reproduce: HF's Qwen3RMSNorm then apply_rotary_pos_emb, in bf16."""
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    from relax.backends.embedded.decode_attention import prepare_qk
    from relax.backends.embedded.norm_rope import rms_norm, rotate

    heads, kvh, dim, n, eps = 16, 8, 64, 64, 1e-6
    gen = torch.Generator().manual_seed(0)
    qk = (torch.randn(n, heads + kvh, dim, generator=gen) * 3).bfloat16()
    pos = torch.randint(0, 300, (n,), generator=gen)
    cos, sin_signed, sin = _rope_tables(dim, 300)
    q_norm, k_norm = Qwen3RMSNorm(dim, eps=eps).bfloat16(), Qwen3RMSNorm(dim, eps=eps).bfloat16()
    with torch.no_grad():
        q_norm.weight.copy_(1 + torch.randn(dim, generator=gen) / 4)
        k_norm.weight.copy_(1 + torch.randn(dim, generator=gen) / 4)
        q, k = apply_rotary_pos_emb(q_norm(qk[:, :heads]).unsqueeze(2), k_norm(qk[:, heads:]).unsqueeze(2),
                                    cos[pos].unsqueeze(1), sin[pos].unsqueeze(1))
        hf = torch.cat([q.squeeze(2), k.squeeze(2)], 1)
        assert torch.equal(prepare_qk(qk, pos, cos, sin_signed, q_norm.weight, k_norm.weight, eps, kvh), hf)
        weights = torch.cat([q_norm.weight.expand(heads, -1), k_norm.weight.expand(kvh, -1)])
        assert torch.equal(rotate(rms_norm(qk, weights, eps), cos[pos].unsqueeze(1), sin_signed[pos].unsqueeze(1)), hf)
        plain = apply_rotary_pos_emb(qk[:, :heads].unsqueeze(2), qk[:, heads:].unsqueeze(2), cos[pos].unsqueeze(1),
                                     sin[pos].unsqueeze(1))  # no q/k-norm (Qwen2, Llama): RoPE alone
        expected = torch.cat([plain[0].squeeze(2), plain[1].squeeze(2)], 1)
        assert torch.equal(prepare_qk(qk, pos, cos, sin_signed, None, None, eps, kvh), expected)


def test_op_with_rope_tables_normalizes_and_rotates_the_raw_projection_first() -> None:
    from relax.backends.embedded.decode_attention import prepare_qk

    qk, vn, kc, vc, pos = _inputs(3, 4, 2, 8, 32, 20, seed=2)
    cos, sin, _ = _rope_tables(8, 32, torch.float32)
    q_norm, k_norm = torch.rand(8) + 0.5, torch.rand(8) + 0.5
    kc2, vc2 = kc.clone(), vc.clone()
    out = decode_attention(qk, vn, kc, vc, pos, 0.25, 20, cos=cos, sin=sin, q_norm=q_norm, k_norm=k_norm, eps=1e-6)
    prepared = prepare_qk(qk, pos, cos, sin, q_norm, k_norm, 1e-6, 2)
    assert torch.equal(out, reference_decode_attention(prepared, vn, kc2, vc2, pos, 0.25, 20))
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)  # the rotated key went into the cache
    assert not torch.equal(prepared, qk)


_TRITON_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from tests.test_decode_attention import _inputs, naive
    from relax.backends.embedded import triton_decode
    results = []
    # (rows, heads, kv heads, dim, view, SMs): one split, several, a view of one, group 1 and 4
    for n, heads, kvh, dim, view, sms in [(3, 4, 2, 16, 150, 132), (3, 4, 2, 16, 150, 1), (2, 8, 2, 32, 257, 132),
                                          (4, 4, 4, 16, 70, 132), (5, 6, 2, 16, 1, 132)]:
        triton_decode.sm_count = lambda device, sms=sms: sms
        qk, vn, kc, vc, pos = _inputs(n, heads, kvh, dim, 300, view, seed=view, dtype=torch.float16)
        expected = naive(qk, vn, kc, vc, pos, 0.125)
        ref_k, ref_v = kc.clone(), vc.clone()
        out = triton_decode.decode_attention(qk, vn, kc, vc, pos, 0.125, view)
        rows = torch.arange(n)
        ref_k[rows, :, pos], ref_v[rows, :, pos] = qk[:, heads:], vn
        results.append(dict(case=[n, heads, kvh, dim, view, sms], splits=triton_decode.split_count(n, kvh, view, sms),
                            err=float((out.double() - expected).abs().max()),
                            caches_equal=bool(torch.equal(kc, ref_k) and torch.equal(vc, ref_v))))
    # shared prompts: rows read a prefix from another slot (one split and several; a prefix ending mid-block)
    from tests.test_decode_attention import _shared_prompts
    for n, heads, kvh, dim, view, sms in [(4, 4, 2, 16, 150, 132), (4, 4, 2, 16, 200, 1)]:
        triton_decode.sm_count = lambda device, sms=sms: sms
        qk, vn, kc, vc, pos = _inputs(n, heads, kvh, dim, 300, view, seed=view + 1, dtype=torch.float16)
        pos[1] = view - 2
        rows, lens = _shared_prompts(n, pos, seed=view)
        rows[0], lens[0] = 1, 70  # row 0 (at the view's bound) reads row 1's first 70: the prefix ends mid-block
        expected = naive(qk, vn, kc, vc, pos, 0.125, rows, lens)
        ref_k, ref_v = kc.clone(), vc.clone()
        out = triton_decode.decode_attention(qk, vn, kc, vc, pos, 0.125, view, rows, lens)
        own = torch.arange(n)
        ref_k[own, :, pos], ref_v[own, :, pos] = qk[:, heads:], vn
        results.append(dict(case=[n, heads, kvh, dim, view, sms, "shared"],
                            splits=triton_decode.split_count(n, kvh, view, sms),
                            err=float((out.double() - expected).abs().max()),
                            caches_equal=bool(torch.equal(kc, ref_k) and torch.equal(vc, ref_v))))
    # q/k-norm and RoPE in the kernel (the raw projection in; without q/k-norm: RoPE alone), one split and several
    from tests.test_decode_attention import _rope_tables
    from relax.backends.embedded.decode_attention import prepare_qk
    for n, heads, kvh, dim, view, sms, norm in [(3, 4, 2, 16, 150, 132, True), (3, 4, 2, 16, 150, 1, True),
                                                (2, 8, 2, 32, 100, 132, False)]:
        triton_decode.sm_count = lambda device, sms=sms: sms
        qk, vn, kc, vc, pos = _inputs(n, heads, kvh, dim, 300, view, seed=view + 2, dtype=torch.float16)
        cos, sin, _ = _rope_tables(dim, 300, torch.float16)
        gen = torch.Generator().manual_seed(view)
        q_norm, k_norm = ((1 + torch.randn(2, dim, generator=gen) / 4).half() if norm else (None, None))
        prepared = prepare_qk(qk, pos, cos, sin, q_norm, k_norm, 1e-6, kvh)
        expected = naive(prepared, vn, kc, vc, pos, 0.125)
        ref_k, ref_v = kc.clone(), vc.clone()
        out = triton_decode.decode_attention(qk, vn, kc, vc, pos, 0.125, view, rope=(cos, sin, q_norm, k_norm, 1e-6))
        own = torch.arange(n)
        ref_k[own, :, pos], ref_v[own, :, pos] = prepared[:, heads:], vn
        results.append(dict(case=[n, heads, kvh, dim, view, sms, "rope", norm],
                            splits=triton_decode.split_count(n, kvh, view, sms),
                            err=float((out.double() - expected).abs().max()),
                            caches_equal=bool(torch.equal(kc, ref_k) and torch.equal(vc, ref_v))))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
def test_triton_kernel_matches_float64_reference_in_the_interpreter() -> None:
    results = run_interpreted(_TRITON_CHECK)
    assert {r["splits"] for r in results} >= {1, 2, 3}, results  # one-split and combine paths both ran
    shared = [r for r in results if "shared" in r["case"]]
    assert len(shared) == 2 and {r["splits"] for r in shared} >= {1, 2}, shared
    rope = [r for r in results if "rope" in r["case"]]  # caches_equal below: the key normalized and rotated bitwise
    assert len(rope) == 3 and {r["splits"] for r in rope} >= {1, 2} and {r["case"][-1] for r in rope} == {True, False}
    for r in results:
        assert r["caches_equal"], r  # the new K/V written at its position, nothing else
        assert r["err"] < 2e-3, r  # fp16 inputs, fp32 softmax: the float64 answer to fp16 output rounding


_HOIST_CHECK = textwrap.dedent("""
    import json, os, sys, torch
    sys.path.insert(0, sys.argv[1])
    from tests.test_decode_attention import _inputs, _rope_tables
    from relax.backends.embedded import triton_decode
    results = []
    # with RoPE (q/k-norm and without; one split and several) and without: the constant loads before the wait and
    # the new token's K/V with the queries (HOIST) or each where it is used
    for n, heads, kvh, dim, view, sms, rope, norm in [(3, 4, 2, 16, 150, 132, True, True), (3, 4, 2, 16, 150, 1, True, True),
                                                      (2, 8, 2, 32, 100, 132, True, False), (3, 4, 2, 16, 150, 1, False, False)]:
        triton_decode.sm_count = lambda device, sms=sms: sms
        runs = {}
        for hoist in ("1", "0"):
            os.environ["RELAX_DECODE_HOIST"] = hoist
            qk, vn, kc, vc, pos = _inputs(n, heads, kvh, dim, 300, view, seed=view + 3, dtype=torch.float16)
            cos, sin, _ = _rope_tables(dim, 300, torch.float16)
            gen = torch.Generator().manual_seed(view)
            q_norm, k_norm = ((1 + torch.randn(2, dim, generator=gen) / 4).half() if norm else (None, None))
            out = triton_decode.decode_attention(qk, vn, kc, vc, pos, 0.125, view,
                                                 rope=(cos, sin, q_norm, k_norm, 1e-6) if rope else None)
            runs[hoist] = (out, kc, vc)
        results.append(dict(case=[n, heads, kvh, dim, view, sms, rope, norm],
                            splits=triton_decode.split_count(n, kvh, view, sms),
                            same=all(torch.equal(a, b) for a, b in zip(runs["1"], runs["0"]))))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
def test_hoisted_loads_leave_the_output_and_the_caches_bitwise_the_same_in_the_interpreter() -> None:
    results = run_interpreted(_HOIST_CHECK)
    assert {r["splits"] for r in results} >= {1, 2} and {r["case"][6] for r in results} == {True, False}, results
    for r in results:
        assert r["same"], r  # the same loads and arithmetic in another order: RELAX_DECODE_HOIST is an A/B switch


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_attention_bench_says_in_one_line_that_it_needs_a_gpu() -> None:
    proc = subprocess.run([sys.executable, str(ROOT / "ci" / "bench_decode_attention.py")], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "needs a CUDA GPU" in proc.stderr
