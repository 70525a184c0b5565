"""The fused Triton log-prob / entropy kernels (`relax.backends.torch.logprobs_triton`) against float64.

On CPU the kernels run under ``TRITON_INTERPRET=1``, in a subprocess because the interpreter is
chosen when ``triton.jit`` decorates; fp32 and fp16 only (the interpreter's bf16 loads are wrong).
The GPU test compares the fused path with the reference path in bf16 at a realistic shape.

Tolerances (all against the float64 answer for the same, already-rounded, inputs):
- values: the kernels compute in fp32; rounding ``z`` and summing ``V`` terms costs a few ulps of
  the largest terms, ~1e-6 relative here, so ``1e-5 * (1 + |ref|)``;
- fp32 gradients: the same fp32 errors, on the scale of the largest entry: ``1e-5 * max|ref|``;
- fp16 gradients: plus the rounding of each entry to fp16 (half an ulp: ``2**-11`` relative, and
  ``2**-25`` absolute among the subnormals).
"""

from __future__ import annotations

import textwrap

import pytest
import torch
import torch.nn.functional as F

from relax.backends.torch import logprobs
from relax.backends.torch.batch import ModelInputs
from tests.triton_helpers import needs_triton, run_interpreted


def reference_float64(logits, rows, positions, targets, vocab_size, temperature, grad_lp, grad_ent):
    """Float64 log-probs, entropies and the logits' gradient of ``sum(grad_lp * lp + grad_ent * entropy)``."""
    x = logits.detach().double().requires_grad_(True)
    z = x[rows, positions, :vocab_size]
    if temperature > 0:
        z = z / temperature
    log_softmax = F.log_softmax(z, dim=-1)
    lp = log_softmax.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    ent = -(log_softmax.exp() * log_softmax).sum(-1)
    (grad_lp.double() * lp + grad_ent.double() * ent).sum().backward()
    return lp.detach(), ent.detach(), x.grad


def value_excess(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error as a multiple of the values' tolerance (<= 1 passes)."""
    return float(((got.detach().double() - ref).abs() / (1e-5 * (1 + ref.abs()))).max())


def grad_excess(got: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest error as a multiple of the gradient tolerance for ``got``'s dtype (<= 1 passes)."""
    allowed = 1e-5 * ref.abs().max() + torch.zeros_like(ref)
    if got.dtype == torch.float16:
        allowed = allowed + 2.0 ** -11 * ref.abs() + 2.0 ** -25
    return float(((got.detach().double() - ref).abs() / allowed).max())


def random_case(b, length, padded, vocab, n, dtype, seed, device="cpu"):
    """Logits as a ``[b, L, V']`` view with non-unit row strides (a transposed ``[L, b, V']``), the padded
    columns huge (they must not count), and ``n`` distinct (row, position) pairs in random order."""
    gen = torch.Generator().manual_seed(seed)
    raw = torch.randn(length, b, padded, generator=gen) * 4
    raw[..., vocab:] = 1e4
    logits = raw.to(dtype).to(device).transpose(0, 1)
    picked = torch.randperm(b * length, generator=gen)[:n]
    targets = torch.randint(0, vocab, (n,), generator=gen)
    grads = torch.randn(2, n, generator=gen)
    return logits, *(t.to(device) for t in (picked // length, picked % length, targets, *grads))


_TRITON_CHECK = textwrap.dedent("""
    import json, sys, torch
    sys.path.insert(0, sys.argv[1])
    from tests.test_logprobs_triton import grad_excess, random_case, reference_float64, value_excess, wiring_case
    from relax.backends.torch import logprobs_triton
    results = []
    # (dtype, temperature, V', V, largest block, with entropy): several blocks with a partial last one,
    # one masked block (the default largest block), no padding; fp16 as well as fp32
    cases = [(dt, t, 128, 100, 32, True) for dt in ("float32", "float16") for t in (1.0, 0.7, 0.0)]
    cases += [("float32", 0.7, 128, 100, 32, False), ("float32", 0.7, 128, 100, logprobs_triton._MAX_BLOCK, True),
              ("float16", 1.0, 96, 96, 32, True)]
    for seed, (dtype, temp, padded, vocab, block, with_entropy) in enumerate(cases):
        logprobs_triton._MAX_BLOCK = block
        logits, rows, positions, targets, g_lp, g_ent = random_case(3, 7, padded, vocab, 12, getattr(torch, dtype), seed)
        if not with_entropy:
            g_ent = torch.zeros_like(g_ent)
        leaf = logits.detach().requires_grad_(True)
        lp, ent = logprobs_triton.fused_token_log_probs(leaf, rows, positions, targets, vocab_size=vocab,
                                                        temperature=temp, with_entropy=with_entropy)
        ((lp * g_lp).sum() + ((ent * g_ent).sum() if with_entropy else 0)).backward()
        ref_lp, ref_ent, ref_grad = reference_float64(logits, rows, positions, targets, vocab, temp, g_lp, g_ent)
        read = torch.zeros(logits.shape, dtype=torch.bool)
        read[rows, positions, :vocab] = True
        r = dict(case=[dtype, temp, padded, vocab, block, with_entropy], lp=value_excess(lp, ref_lp),
                 grad=grad_excess(leaf.grad, ref_grad), grad_dtype=str(leaf.grad.dtype),
                 lp_err=float((lp.double() - ref_lp).abs().max()),
                 grad_err=float((leaf.grad.double() - ref_grad).abs().max()),
                 zero_elsewhere=bool((leaf.grad[~read] == 0).all()))
        # the gradient as the kernel lays it out (torch.autograd.grad: no AccumulateGrad restriding): the logits'
        # own strides, so the transposed view of Megatron's [L, b, V'] output gets an [L, b, V'] gradient
        other = logits.detach().requires_grad_(True)
        raw, = torch.autograd.grad(logprobs_triton.fused_token_log_probs(
            other, rows, positions, targets, vocab_size=vocab, temperature=temp, with_entropy=False)[0].sum(), other)
        r.update(grad_layout=[list(raw.stride()), list(logits.stride())])
        if with_entropy:
            r.update(ent=value_excess(ent, ref_ent), ent_err=float((ent.double() - ref_ent).abs().max()))
        else:
            r.update(ent_shape=list(ent.shape))
        if temp == 0.7 and with_entropy:  # planted bugs the comparison must catch
            r.update(planted_no_temperature=grad_excess(leaf.grad, ref_grad * temp),
                     planted_no_entropy_term=grad_excess(
                         leaf.grad, reference_float64(logits, rows, positions, targets, vocab, temp, g_lp,
                                                      torch.zeros_like(g_ent))[2]))
        results.append(r)
    logprobs_triton._MAX_BLOCK = 32
    results.append(dict(case="wiring", **wiring_case()))
    print("RESULT " + json.dumps(results))
""")


def wiring_case() -> dict:
    """`log_probs_from_logits` on padded fp32 logits (fused when available): errors vs float64, chunked ==
    unchunked, the no-entropy call, and an empty selection."""
    from relax.backends.torch.logprobs import fused_log_probs_available, log_probs_from_logits

    logits, *_ = random_case(4, 9, 80, 70, 0, torch.float32, seed=99)
    gen = torch.Generator().manual_seed(5)
    lengths = torch.tensor([5, 0, 8, 3])
    valid = torch.arange(8) < lengths[:, None]
    positions = (torch.arange(8) + torch.tensor([0, 1, 0, 5])[:, None]).clamp(max=8)
    inputs = ModelInputs(torch.zeros(4, 9, dtype=torch.long), torch.ones(4, 9, dtype=torch.long), positions,
                         torch.randint(0, 70, (4, 8), generator=gen), valid)
    weights = torch.randn(2, 4, 8, generator=gen)
    runs = []
    for chunk in (-1, 5):
        leaf = logits.detach().requires_grad_(True)
        lp, ent = log_probs_from_logits(leaf, inputs, temperature=0.7, with_entropy=True, chunk_size=chunk,
                                        vocab_size=70)
        ((lp * weights[0]).sum() + (ent * weights[1]).sum()).backward()
        runs.append((lp.detach(), ent.detach(), leaf.grad))
    rows, cols = valid.nonzero(as_tuple=True)
    ref_lp, ref_ent, ref_grad = reference_float64(logits, rows, positions[rows, cols], inputs.target_ids[rows, cols],
                                                  70, 0.7, weights[0][rows, cols], weights[1][rows, cols])
    (lp, ent, grad), chunked = runs
    no_entropy = log_probs_from_logits(logits, inputs, temperature=0.7, with_entropy=False, vocab_size=70)
    empty = ModelInputs(inputs.input_ids, inputs.attention_mask, positions, inputs.target_ids, valid & False)
    leaf = logits.detach().requires_grad_(True)
    empty_lp, empty_ent = log_probs_from_logits(leaf, empty, temperature=0.7, with_entropy=True, vocab_size=70)
    (empty_lp.sum() + empty_ent.sum()).backward()
    return dict(fused=fused_log_probs_available(logits), lp=value_excess(lp[valid], ref_lp),
                ent=value_excess(ent[valid], ref_ent), grad=grad_excess(grad, ref_grad),
                padding_zero=bool((lp[~valid] == 0).all() and (ent[~valid] == 0).all()),
                chunked_equal=all(torch.equal(a, c) for a, c in zip(runs[0], chunked, strict=True)),
                no_entropy=no_entropy[1] is None and torch.equal(no_entropy[0], lp),
                empty=bool((empty_lp == 0).all() and (empty_ent == 0).all() and (leaf.grad == 0).all()))


@needs_triton
@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU the compiled kernels are tested (the GPU test below); "
                    "the GPU machine's Triton 3.6 interpreter cannot run these kernels, CI's 3.8 can")
def test_triton_kernels_match_float64_reference_in_the_interpreter() -> None:
    *results, wiring = run_interpreted(_TRITON_CHECK)
    for r in results:
        dtype, with_entropy = r["case"][0], r["case"][5]
        assert r["lp"] <= 1 and r["grad"] <= 1, r
        assert r["grad_dtype"] == f"torch.{dtype}", r  # the gradient comes in the logits' dtype
        assert r["zero_elsewhere"], r  # unselected positions and padded columns: exactly 0
        assert r["grad_layout"][0] == r["grad_layout"][1], r
        assert r["ent"] <= 1 if with_entropy else r["ent_shape"] == [], r
    planted = [r for r in results if "planted_no_temperature" in r]
    assert len(planted) == 3, results  # fp32 and fp16, several blocks and one
    for r in planted:  # the tolerances are tight enough to see a missing 1/T or a dropped entropy term
        assert r["planted_no_temperature"] > 10 and r["planted_no_entropy_term"] > 10, r
    assert wiring.pop("fused") is True, wiring
    assert wiring["lp"] <= 1 and wiring["ent"] <= 1 and wiring["grad"] <= 1, wiring
    assert all(wiring[k] for k in ("padding_zero", "chunked_equal", "no_entropy", "empty")), wiring


def test_cpu_runs_keep_the_reference_path_without_the_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert not logprobs.fused_log_probs_available(torch.zeros(2, 3, 4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_fused_path_matches_reference_path_in_bf16_on_gpu(monkeypatch) -> None:
    """b=8, L=384, V=32000 padded to 32064, ~2000 response tokens: the fused path against the reference
    path (both fp32 math on the same bf16 logits) and against float64; chunking changes nothing."""
    b, length, width, vocab, padded = 8, 384, 300, 32000, 32064
    gen = torch.Generator().manual_seed(0)
    logits = (torch.randn(b, length, padded, generator=gen) * 3).to(torch.bfloat16).cuda()
    lengths = torch.randint(200, width + 1, (b,), generator=gen)
    prompt = torch.randint(10, length - width, (b,), generator=gen)
    valid = torch.arange(width) < lengths[:, None]
    inputs = ModelInputs(torch.zeros(b, length, dtype=torch.long), torch.ones(b, length, dtype=torch.long),
                         prompt[:, None] - 1 + torch.arange(width), torch.randint(0, vocab, (b, width), generator=gen),
                         valid)
    inputs = ModelInputs(*(t.cuda() for t in (inputs.input_ids, inputs.attention_mask, inputs.logit_positions,
                                               inputs.target_ids, inputs.valid)))
    weights = torch.randn(2, b, width, generator=gen).cuda()
    assert logprobs.fused_log_probs_available(logits)

    def run(chunk):
        leaf = logits.detach().requires_grad_(True)
        lp, ent = logprobs.log_probs_from_logits(leaf, inputs, temperature=0.7, with_entropy=True, chunk_size=chunk,
                                                 vocab_size=vocab)
        ((lp * weights[0]).sum() + (ent * weights[1]).sum()).backward()
        return lp.detach(), ent.detach(), leaf.grad

    fused, fused_chunked = run(-1), run(512)
    monkeypatch.setattr(logprobs, "fused_log_probs_available", lambda _: False)
    reference = run(-1)
    assert all(torch.equal(a, c) for a, c in zip(fused, fused_chunked, strict=True))
    mask = inputs.valid
    rows, cols = mask.nonzero(as_tuple=True)
    ref_lp, ref_ent, ref_grad = reference_float64(logits, rows, inputs.logit_positions[rows, cols],
                                                  inputs.target_ids[rows, cols], vocab, 0.7, weights[0][mask],
                                                  weights[1][mask])
    for got in (fused, reference):
        assert value_excess(got[0][mask], ref_lp) <= 1 and value_excess(got[1][mask], ref_ent) <= 1
    assert fused[2].dtype == torch.bfloat16 and bool((fused[2][..., vocab:] == 0).all())
    # each path rounds its fp32 gradient to bf16: at most one bf16 ulp (2**-7 relative) apart
    diff = (fused[2].float() - reference[2].float()).abs()
    assert bool((diff <= 2.0 ** -7 * reference[2].float().abs() + 1e-6 * float(ref_grad.abs().max())).all())
