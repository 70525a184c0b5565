"""The trainer's directly launched RMSNorm / RoPE forward kernels (relax/backends/megatron/forward_kernels.py).

On CPU they run under ``TRITON_INTERPRET=1`` (a subprocess: the interpreter is chosen when ``triton.jit``
decorates) against float64 forms of the compiled functions they replace (norms._rms_forward, and
rope_fusion._rope_forward's formula) on the same rounded inputs; fp32 and fp16 (the interpreter's bf16 loads are
wrong). Inputs are strided views as the trainer passes them: a q/k split of a fused projection, 2-4 dims,
several rows per program with a partial last program, RoPE on part of the head dim.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from tests.triton_helpers import needs_triton, run_interpreted

_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from relax.backends.megatron import forward_kernels
    from relax.backends.megatron.norms import _rms_forward
    from tests.triton_helpers import refusal
    gen = torch.Generator().manual_seed(0)
    results = []

    # largest error in units of the dtype's epsilon times scale (default |ref|: one rounding of the answer; RoPE
    # passes the size of its two terms, whose sum may cancel)
    def excess(got, ref, dtype, scale=None):
        scale = ref.abs() if scale is None else scale
        ulp = torch.finfo(dtype).eps * scale.clamp(min=torch.finfo(dtype).tiny)
        return float(((got.double() - ref).abs() / ulp).max())

    forward_kernels._TILE = 64  # several rows per program, partial last programs, RoPE positions in several chunks
    for dtype in (torch.float32, torch.float16):
        # [s, b, heads, 3 * d] fused projection, q/k/v views of it (not contiguous), and a contiguous hidden [s, b, h]
        fused = (torch.randn(5, 3, 4, 3 * 16, generator=gen) * 2).to(dtype)
        q = fused[..., :16]
        hidden = torch.randn(5, 3, 40, generator=gen).to(dtype)
        flat = torch.randn(7, 24, generator=gen).to(dtype)
        for name, x in (("q view", q), ("hidden", hidden), ("2-d", flat)):
            w = (torch.randn(x.shape[-1], generator=gen) * 0.5 + 1).to(dtype)
            got = forward_kernels.rms_norm_forward(x, w, 1e-6)
            ref = _rms_forward(x.double(), w.double(), 1e-6)
            results.append(dict(kind="rms", dtype=str(dtype), case=name, excess=excess(got, ref, dtype),
                                contiguous=got.is_contiguous(), shape_ok=list(got.shape) == list(x.shape),
                                dtype_ok=got.dtype == dtype))
        for rot in (16, 8):
            freqs = torch.rand(5, 1, 1, rot, generator=gen) * 6
            got = forward_kernels.rope_forward(q, freqs)
            # the reference: the compiled function's formula, cos/sin rounded to the dtype first, the rest fp64
            cos, sin = torch.cos(freqs).to(dtype).double(), torch.sin(freqs).to(dtype).double()
            x = q.double()
            x1, x2 = x[..., :rot // 2], x[..., rot // 2:rot]
            ref = torch.cat((x[..., :rot] * cos + torch.cat((-x2, x1), -1) * sin, x[..., rot:]), -1)
            terms = torch.cat(((x[..., :rot] * cos).abs() + (torch.cat((-x2, x1), -1) * sin).abs(), x[..., rot:].abs()),
                              -1)
            flipped = torch.cat((x[..., :rot] * cos + torch.cat((x2, -x1), -1) * sin, x[..., rot:]), -1)
            results.append(dict(kind="rope", dtype=str(dtype), case=f"rot {rot}", excess=excess(got, ref, dtype, terms),
                                passthrough=bool(torch.equal(got[..., rot:], q[..., rot:])),
                                planted_flipped_rotation=excess(got, flipped, dtype, terms)))
    results.append(dict(kind="refusals", strided_last=refusal(lambda: forward_kernels.rms_norm_forward(
                            torch.zeros(4, 6)[:, ::2], torch.ones(3), 1e-6)),
                        odd_rot=refusal(lambda: forward_kernels.rope_forward(torch.zeros(2, 1, 1, 8),
                                                                             torch.zeros(2, 1, 1, 3)))))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the trainer's GPU tests run the compiled kernels")
def test_direct_forward_kernels_match_the_compiled_functions_formulas_in_the_interpreter() -> None:
    *results, refusals = run_interpreted(_CHECK)
    assert len(results) == 10, results
    for r in results:
        if r["kind"] == "rms":
            # fp32 math, one rounding: within an ulp or two of the rounded float64 answer
            assert r["excess"] <= 2 and r["contiguous"] and r["shape_ok"] and r["dtype_ok"], r
        else:
            assert r["excess"] <= 2 and r["passthrough"], r
            assert r["planted_flipped_rotation"] > 100, r  # the comparison sees a rotation the wrong way round
    assert "contiguous last dim" in refusals["strided_last"], refusals
    assert "even rot" in refusals["odd_rot"], refusals


def test_cpu_tensors_keep_the_compiled_functions_path() -> None:
    pytest.importorskip("triton")
    from relax.backends.megatron import forward_kernels

    assert not forward_kernels.takes(torch.zeros(2, 3))  # CPU: the compiled function runs (eagerly there)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_direct_kernels_agree_with_the_compiled_functions_in_bf16_on_gpu() -> None:
    """At the GRPO bench's shapes (q split of a fused projection, hidden rows): the direct kernels and the compiled
    functions they stand in for differ by at most one bf16 rounding, and each is deterministic."""
    pytest.importorskip("triton")
    from relax.backends.megatron import forward_kernels, norms, rope_fusion

    gen = torch.Generator().manual_seed(3)
    fused = (torch.randn(384, 8, 8, 3 * 64, generator=gen) * 2).bfloat16().cuda()
    q, hidden = fused[..., :64], (torch.randn(384, 8, 1024, generator=gen) * 2).bfloat16().cuda()
    for x in (q, hidden):
        w = (torch.randn(x.shape[-1], generator=gen) * 0.5 + 1).bfloat16().cuda()
        direct, compiled = forward_kernels.rms_norm_forward(x, w, 1e-6), norms._FORWARD(x, w, 1e-6)
        assert torch.equal(direct, forward_kernels.rms_norm_forward(x, w, 1e-6))
        ulp = torch.finfo(torch.bfloat16).eps * compiled.float().abs().clamp(min=1e-30)
        assert float(((direct.float() - compiled.float()).abs() / ulp).max()) <= 1.0
    freqs = (torch.rand(384, 1, 1, 64, generator=gen) * 100).cuda()
    direct, compiled = forward_kernels.rope_forward(q, freqs), rope_fusion._FORWARD(q, freqs)
    terms = q.float().abs() + torch.cat((q[..., 32:], q[..., :32]), -1).float().abs()  # |x| + |rotate_half(x)|
    assert float(((direct.float() - compiled.float()).abs() / (torch.finfo(torch.bfloat16).eps * terms.clamp(
        min=1e-30))).max()) <= 1.0
