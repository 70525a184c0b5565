"""The unfiltered decode sampler (relax/backends/embedded/triton_sample.py) and its op (draw_op.py).

The kernels run here under ``TRITON_INTERPRET=1`` (CPU tensors, numpy) in a subprocess, without PDL, against a
float64 inverse-CDF reference: the same token wherever the target is not within rounding of a CDF step, log-probs
to fp32 rounding, greedy rows on the first largest logit, no token of zero probability, the in-kernel hash bit for
bit `counter_uniform`, and the token frequencies of many draws matching the distribution. On the GPU (``gpu``
marker) the compiled kernels against torch's `draw` on bench-270m's shape, eagerly and inside a CUDA graph.
"""

from __future__ import annotations

import textwrap

import pytest
import torch

from relax.backends.embedded.draw_op import draw_step, draw_unfiltered, reference_unfiltered
from relax.backends.embedded.sampling import counter_uniform, draw
from tests.triton_helpers import needs_triton, run_interpreted


def reference(logits, temp, seed, counter):
    """float64 inverse CDF: the token whose CDF step holds ``u * total`` (greedy rows: the first largest logit), its
    log-prob, and how far the target sits from that step's ends (inf for greedy rows)."""
    scaled = logits.double() / torch.where(temp > 0, temp, torch.ones_like(temp)).double().unsqueeze(-1)
    logp = torch.log_softmax(scaled, -1)
    cdf = logp.exp().cumsum(-1)
    target = counter_uniform(seed, counter).double() * cdf[:, -1]
    tok = (cdf <= target.unsqueeze(-1)).sum(-1).clamp(max=logits.shape[1] - 1)
    tok = torch.where(temp > 0, tok, logits.float().argmax(-1))
    hi = cdf.gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    lo = hi - logp.exp().gather(-1, tok.unsqueeze(-1)).squeeze(-1)
    margin = torch.minimum(target - lo, hi - target).abs()
    return tok, logp.gather(-1, tok.unsqueeze(-1)).squeeze(-1), torch.where(temp > 0, margin, torch.inf)


_KERNEL_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from relax.backends.embedded import triton_sample
    from tests.test_triton_sample import reference
    results = []
    gen = torch.Generator().manual_seed(0)
    # (rows, vocab, chunk, dtype): one piece, pieces that do not divide the vocabulary, many pieces
    for rows, vocab, chunk, dtype in [(6, 512, 4096, torch.bfloat16), (9, 1000, 256, torch.float32),
                                      (5, 3000, 1024, torch.float16), (4, 777, 64, torch.float32)]:
        logits = (torch.randn(rows, vocab, generator=gen) * 3).to(dtype)
        temp = torch.tensor([1.0, 0.0, 0.7, 1.3, 2.0, 0.0, 1.0, 0.5, 1.0])[:rows]
        seed = torch.randint(0, 1 << 62, (rows,), generator=gen)
        counter = torch.randint(0, 1 << 20, (rows,), generator=gen)
        tok, lp = triton_sample.sample_unfiltered(logits, temp, seed, counter, pdl=False, chunk=chunk)
        ref_tok, ref_lp, margin = reference(logits, temp, seed, counter)
        results.append(dict(case=[rows, vocab, chunk, str(dtype)], dtypes=[str(tok.dtype), str(lp.dtype)],
                            tok=tok.tolist(), ref=ref_tok.tolist(), margin=margin.tolist(),
                            lp_err=float((lp.double() - ref_lp).abs().max())))
    print("RESULT " + json.dumps(results))
""")


@needs_triton
def test_kernels_draw_the_float64_inverse_cdf_token_in_the_interpreter() -> None:
    for r in run_interpreted(_KERNEL_CHECK):
        assert r["dtypes"] == ["torch.int64", "torch.float32"], r
        for tok, ref, margin in zip(r["tok"], r["ref"], r["margin"], strict=True):
            assert tok == ref or margin < 1e-5, r  # only a target within rounding of a CDF step may move
        assert r["lp_err"] < 1e-5, r


_EDGE_CHECK = textwrap.dedent("""
    import json, sys, torch, triton
    import triton.language as tl
    sys.path.insert(0, sys.argv[1])
    from relax.backends.embedded import triton_sample
    from relax.backends.embedded.sampling import counter_uniform

    @triton.jit
    def uniform_kernel(SEED, COUNTER, OUT, BLOCK: tl.constexpr):
        i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(OUT + i, triton_sample.counter_uniform(tl.load(SEED + i), tl.load(COUNTER + i)))

    gen = torch.Generator().manual_seed(1)
    seed = torch.cat([torch.randint(0, 1 << 62, (250,), generator=gen), torch.tensor([0, 1, (1 << 63) - 1, 1 << 32,
                                                                                       (1 << 32) - 1, 12345])])
    counter = torch.cat([torch.randint(0, 1 << 31, (250,), generator=gen), torch.tensor([0, 0, 7, (1 << 32) - 1,
                                                                                         1 << 32, 3])])
    out = torch.empty(256)
    uniform_kernel[(2,)](seed, counter, out, BLOCK=128)
    same_hash = bool(torch.equal(out, counter_uniform(seed, counter)))

    # -inf logits: a whole piece of them, and scattered ones; ties for the greedy rows
    logits = torch.randn(8, 600, generator=gen)
    logits[:, 128:256] = float("-inf")
    logits[:, ::7] = float("-inf")
    logits[1, 300] = logits[1, 450] = 50.0  # greedy: the first of two tied maxima
    logits[3, :] = float("-inf")
    logits[3, 590] = 0.0  # one finite token
    temp = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.3, 1.0, 5.0, 1.0])
    masked = []
    for c in range(12):
        tok, lp = triton_sample.sample_unfiltered(logits, temp, torch.arange(8) + 99, torch.full((8,), c), pdl=False,
                                                  chunk=128)
        masked.append(bool(torch.isinf(logits.gather(-1, tok.unsqueeze(-1))).any()))
        if c == 0:
            first = dict(tok=tok.tolist(), lp=lp.tolist())

    # frequencies: one 5-token distribution drawn 800 times (counters 0..799), two pieces per row
    probs = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])
    rows = 800
    logits = probs.log().repeat(rows, 1)
    tok, _ = triton_sample.sample_unfiltered(logits, torch.ones(rows), torch.full((rows,), 5), torch.arange(rows),
                                             pdl=False, chunk=4)
    counts = torch.bincount(tok, minlength=5).tolist()
    print("RESULT " + json.dumps(dict(same_hash=same_hash, masked=masked, first=first, counts=counts)))
""")


@needs_triton
def test_hash_masked_logits_ties_and_frequencies_in_the_interpreter() -> None:
    r = run_interpreted(_EDGE_CHECK)
    assert r["same_hash"], "the kernel's counter_uniform differs from sampling.counter_uniform"
    assert not any(r["masked"]), r  # no -inf token, whatever the draw
    assert r["first"]["tok"][1] == 300, r  # greedy: the first of tied maxima
    assert r["first"]["tok"][3] == 590 and abs(r["first"]["lp"][3]) < 1e-6, r  # the only finite token: log-prob 0
    expected = [0.05, 0.4, 0.1, 0.3, 0.15]
    chi2 = sum((c - 800 * p) ** 2 / (800 * p) for c, p in zip(r["counts"], expected, strict=True))
    assert chi2 < 18.47, r  # chi-square, 4 degrees of freedom, p = 0.001


def test_op_on_cpu_is_draw_unfiltered_and_one_opaque_call_under_compile() -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(7, 300, generator=gen) * 2
    temp = torch.tensor([1.0, 0.0, 0.5, 1.5, 1.0, 0.0, 1.0])
    top_p, top_k = torch.full((7,), 0.9), torch.full((7,), 5)
    seed, counter = torch.arange(7) * 31 + 1, torch.arange(7) + 4
    expected = draw(logits, temp, torch.ones(7), torch.full((7,), -1), seed, counter, filtered=False)
    for got in (draw_unfiltered(logits, temp, seed, counter), reference_unfiltered(logits, temp, seed, counter),
                torch.compile(draw_unfiltered, dynamic=True)(logits, temp, seed, counter)):
        assert torch.equal(got[0], expected[0]) and torch.equal(got[1], expected[1])
    # draw_step: CPU batches and filtered ones are draw's
    assert all(torch.equal(a, b) for a, b in zip(draw_step(logits, temp, top_p, top_k, seed, counter, True),
                                                 draw(logits, temp, top_p, top_k, seed, counter, True), strict=True))
    assert all(torch.equal(a, b) for a, b in zip(draw_step(logits, temp, top_p, top_k, seed, counter, False),
                                                 expected, strict=True))


def test_supports_two_d_float_logits_with_contiguous_rows() -> None:
    triton_sample = pytest.importorskip("relax.backends.embedded.triton_sample")
    assert triton_sample.supports(torch.zeros(4, 10, dtype=torch.bfloat16))
    assert triton_sample.supports(torch.zeros(4, 20)[:, :10])  # a row stride past the width is fine
    assert not triton_sample.supports(torch.zeros(10, 4).T)
    assert not triton_sample.supports(torch.zeros(4, 10, dtype=torch.int32))
    assert not triton_sample.supports(torch.zeros(10))
    assert not triton_sample.supports(torch.zeros(0, 10))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_gpu_kernels_draw_what_torch_draws_eagerly_and_in_a_graph() -> None:
    """bench-270m's shape (64 rows, 32,000 bf16 logits, 8 pieces): the compiled kernels against torch's `draw` on
    the same GPU (fp32 sums in another order: a token may move only where the target sits within rounding of a CDF
    step), then the op captured in a CUDA graph replays the eager op's draw bit for bit."""
    gen = torch.Generator().manual_seed(4)
    rows, vocab = 64, 32000
    logits = (torch.randn(rows, vocab, generator=gen) * 4).bfloat16().cuda()
    temp = torch.ones(rows).cuda()
    temp[::9] = 0.0
    top_p, top_k = torch.ones(rows).cuda(), torch.full((rows,), -1).cuda()
    seed = torch.randint(0, 1 << 62, (rows,), generator=gen).cuda()
    counter = torch.randint(0, 1 << 20, (rows,), generator=gen).cuda()
    tok, lp = draw_unfiltered(logits, temp, seed, counter)
    ref_tok, ref_lp = draw(logits, temp, top_p, top_k, seed, counter, filtered=False)
    _, f64_lp, margin = reference(logits.cpu(), temp.cpu(), seed.cpu(), counter.cpu())
    moved = (tok != ref_tok).cpu()
    assert not moved.any() or (margin[moved] < 1e-5).all(), (tok, ref_tok, margin)
    assert (lp.cpu().double() - f64_lp).abs().max() < 1e-5
    assert (lp - ref_lp)[~moved.cuda()].abs().max() < 1e-5
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_out = draw_unfiltered(logits, temp, seed, counter)
    counter += 1
    graph.replay()
    again = draw_unfiltered(logits, temp, seed, counter)
    assert torch.equal(graph_out[0], again[0]) and torch.equal(graph_out[1], again[1])
