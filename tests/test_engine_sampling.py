"""The engine's sampler: counter-based random numbers and vocabulary-order inverse-CDF sampling,
checked against plain float64 references; plus the lean runner's fused-weight bookkeeping."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.embedded.sampling import counter_uniform, sample_batch

torch.set_num_threads(1)


def ref_mix32(x: int) -> int:
    x ^= x >> 16
    x = (x * 0x7FEB352D) & 0xFFFFFFFF
    x ^= x >> 15
    x = (x * 0x846CA68B) & 0xFFFFFFFF
    return x ^ (x >> 16)


def ref_uniform(seed: int, counter: int) -> float:
    h = ref_mix32((counter + 0x9E3779B9) & 0xFFFFFFFF)
    h = ref_mix32(h ^ (seed >> 32))
    h = ref_mix32(h ^ (seed & 0xFFFFFFFF))
    return (h >> 8) / float(1 << 24)


@given(st.lists(st.tuples(st.integers(0, (1 << 63) - 1), st.integers(0, 1 << 40)), min_size=1, max_size=20))
def test_counter_uniform_matches_python_integer_reference(pairs) -> None:
    seeds = torch.tensor([s for s, _ in pairs], dtype=torch.long)
    counters = torch.tensor([c for _, c in pairs], dtype=torch.long)
    got = counter_uniform(seeds, counters).tolist()
    assert got == [ref_uniform(s, c) for s, c in pairs]


def test_counter_uniform_is_uniform_and_decorrelated() -> None:
    n = 200_000
    seeds = torch.arange(n, dtype=torch.long) // 100 * 7919 + 12345
    counters = torch.arange(n, dtype=torch.long) % 100
    u = counter_uniform(seeds, counters).double()
    assert 0 <= float(u.min()) and float(u.max()) < 1
    counts = torch.histc(u, bins=50, min=0, max=1)
    expected = n / 50
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 100, chi2  # 49 dof: p(chi2 > 100) < 1e-4
    # consecutive tokens of one request, and neighbouring seeds at one token, are uncorrelated
    steps = u.view(-1, 100)
    assert abs(float(torch.corrcoef(torch.stack([steps[:, :-1].flatten(), steps[:, 1:].flatten()]))[0, 1])) < 0.02
    assert abs(float(torch.corrcoef(torch.stack([steps[:-1, 0], steps[1:, 0]]))[0, 1])) < 0.05


def ref_sample(logits: list[float], temperature: float, top_p: float, top_k: int, u: float) -> tuple[int, float]:
    """One row in float64: filter by rank (top-k, top-p over mass strictly above), then pick in vocab order."""
    if temperature <= 0:
        best = max(range(len(logits)), key=lambda i: (logits[i], -i))
        z = math.log(sum(math.exp(x) for x in logits))
        return best, logits[best] - z
    scaled = [x / temperature for x in logits]
    z = math.log(sum(math.exp(x) for x in scaled))
    probs = [math.exp(x - z) for x in scaled]
    ranked = sorted(range(len(probs)), key=lambda i: -probs[i])  # stable: ties keep vocab order
    keep, above = set(), 0.0
    for rank, i in enumerate(ranked):
        if rank == 0 or ((above < top_p or top_p >= 1) and (top_k <= 0 or rank < top_k)):
            keep.add(i)
        above += probs[i]
    total = sum(probs[i] for i in keep)
    acc = 0.0
    for i in range(len(probs)):
        if i in keep:
            acc += probs[i]
            if acc > u * total:
                return i, scaled[i] - z
    return max(keep), scaled[max(keep)] - z


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.0, 0.5, 1.0, 1.7]), st.sampled_from([0.3, 0.8, 1.0]),
       st.sampled_from([-1, 1, 3, 8]))
def test_sample_batch_matches_float64_reference(seed, temperature, top_p, top_k) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 24, generator=gen, dtype=torch.float64) * 3
    u = torch.rand(6, generator=gen, dtype=torch.float64).float()
    b = logits.shape[0]
    tokens, lps = sample_batch(logits, torch.full((b,), temperature), torch.full((b,), top_p),
                               torch.full((b,), top_k, dtype=torch.long), u)
    for row in range(b):
        tok, lp = ref_sample(logits[row].tolist(), temperature, top_p, top_k, float(u[row]))
        assert int(tokens[row]) == tok
        assert abs(float(lps[row]) - lp) < 1e-4


@settings(max_examples=40, deadline=None)
@given(st.integers(0, 10_000))
def test_unfiltered_rows_ignore_the_filtered_path(seed) -> None:
    """A row without top-p/top-k gets the same token whether or not its batch needed the sort."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(8, 50, generator=gen) * 4
    u = torch.rand(8, generator=gen)
    temp, top_p, top_k = torch.ones(8), torch.ones(8), torch.full((8,), -1)
    plain = sample_batch(logits, temp, top_p, top_k, u, filtered=False)
    sorted_path = sample_batch(logits, temp, top_p, top_k, u, filtered=True)
    assert torch.equal(plain[0], sorted_path[0]) and torch.equal(plain[1], sorted_path[1])


def test_sample_batch_frequencies_follow_the_distribution() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]]).repeat(40_000, 1)
    n = logits.shape[0]
    u = counter_uniform(torch.full((n,), 99, dtype=torch.long), torch.arange(n))
    tokens, _ = sample_batch(logits, torch.ones(n), torch.ones(n), torch.full((n,), -1), u, filtered=False)
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert torch.allclose(freq, torch.softmax(logits[0].double(), -1), atol=0.01), freq


def _qwen3(**kw):
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                                   max_position_embeddings=128, **kw)
    torch.manual_seed(0)
    return transformers.Qwen3ForCausalLM(cfg).float().eval()


def _greedy(engine, prompt, n=8):
    req = {"input_ids": prompt, "sampling_params": {"temperature": 0.0, "max_new_tokens": n}}
    return engine.generate([req])[0]["output_ids"]


def test_lean_runner_follows_in_place_updates_and_repointed_parameters() -> None:
    from relax.backends.embedded.engine import EmbeddedEngine

    model = _qwen3()
    lean = EmbeddedEngine(model, eos_token_ids=[], runner="lean")
    before = _greedy(lean, [1, 2, 3])
    q = model.model.layers[0].self_attn.q_proj.weight
    with torch.no_grad():
        q.mul_(-3.0)  # in place: must reach the fused buffer
    reference = EmbeddedEngine(model, eos_token_ids=[], runner="hf")
    after = _greedy(reference, [1, 2, 3])
    assert after != before
    assert _greedy(lean, [1, 2, 3]) == after
    model.model.layers[1].mlp.up_proj.weight.data = model.model.layers[1].mlp.up_proj.weight.data.clone() * 2
    assert _greedy(lean, [1, 2, 3]) == _greedy(reference, [1, 2, 3])  # re-pointed: the runner re-fuses


def test_lean_runner_keeps_its_weight_layout_across_generates_and_redoes_it_only_when_a_parameter_moves() -> None:
    """The fused layout (and with it every captured decode graph, which bakes in its address) outlives a generate;
    until 2026-11-26 the check compared the arena's parameter order with the model's and every prefill laid the
    weights out again (on the H100: a graph capture per generate)."""
    from relax.backends.embedded.engine import EmbeddedEngine

    model = _qwen3()
    lean = EmbeddedEngine(model, eos_token_ids=[], runner="lean")
    _greedy(lean, [1, 2, 3])
    arena = lean.runner._arena
    _greedy(lean, [4, 5])
    assert lean.runner._arena is arena and lean.runner._fused_ok()
    model.lm_head.weight.data = model.lm_head.weight.data.clone()  # re-pointed: not the arena's view any more
    assert not lean.runner._fused_ok()
    _greedy(lean, [4, 5])
    assert lean.runner._arena is not arena and lean.runner._fused_ok()


def test_compiled_prefill_layers_round_as_the_eager_ones() -> None:
    """The prefill's compiled dense parts (on CUDA; compiled here on the CPU) equal the eager ones bit for bit in
    bf16: inductor rounds each intermediate as the eager ops do (`_compile_as_eager`), so compiling the prefill
    moves no log-prob. Without that option the same compile differs here (checked when this test was written)."""
    from relax.backends.embedded.lean_runner import LeanRunner, _compile_as_eager

    model = _qwen3().bfloat16()
    runner = LeanRunner(model, torch.device("cpu"), slots=4, max_len=64)
    runner._prepare()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(3, 17, 32, generator=gen).bfloat16()
    attn = torch.randn(3, 17, runner.heads * runner.head_dim, generator=gen).bfloat16()
    cos, sin = (t[:17].unsqueeze(1) for t in runner._rope)
    torch._dynamo.reset()
    qk, v = _compile_as_eager(runner._layer_in, None)(x, cos, sin, *runner._in_weights(0))
    eager_qk, eager_v = runner._layer_in(x, cos, sin, *runner._in_weights(0))
    assert torch.equal(qk, eager_qk) and torch.equal(v, eager_v)
    out = _compile_as_eager(runner._layer_out, None)(x, attn, *runner._out_weights(1))
    assert torch.equal(out, runner._layer_out(x, attn, *runner._out_weights(1)))
    torch._dynamo.reset()


def test_lm_head_runs_through_the_decode_projection_unless_switched_off(monkeypatch) -> None:
    """The decode's LM head goes through the projection op it is given (`decode_linear`: on CUDA the skinny GEMM
    with PDL), on the final norm's output; ``RELAX_DECODE_HEAD=0`` keeps the module's own ``F.linear``, and so does
    a caller without the op (the prefill)."""
    from relax.backends.embedded.lean_runner import LeanRunner

    model = _qwen3().double()
    runner = LeanRunner(model, torch.device("cpu"), slots=4, max_len=64)
    runner._prepare()
    x = torch.randn(3, 32, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    calls = []

    def linear(inp, weight, bias):
        calls.append(weight)
        return torch.nn.functional.linear(inp, weight, bias)

    expected = model.lm_head(model.model.norm(x))
    monkeypatch.setenv("RELAX_DECODE_HEAD", "1")
    torch.testing.assert_close(runner._logits(x, linear), expected)
    assert len(calls) == 1 and calls[0] is model.lm_head.weight
    monkeypatch.setenv("RELAX_DECODE_HEAD", "0")
    torch.testing.assert_close(runner._logits(x, linear), expected)
    torch.testing.assert_close(runner._logits(x), expected)
    assert len(calls) == 1  # neither went through the op


def test_split_k_o_and_down_projections_give_the_layer_the_unsplit_output() -> None:
    """The decode's split-K o and down projections (`decode_linear_partials`, their partials added in the residual
    add, compiled on CUDA): the layer's output equals the unsplit one's up to the fp32 sum order, float64 model."""
    from relax.backends.embedded.lean_runner import LeanRunner

    model = _qwen3().double()
    runner = LeanRunner(model, torch.device("cpu"), slots=4, max_len=64)
    runner._prepare()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(5, 32, generator=gen, dtype=torch.float64)
    attn = torch.randn(5, runner.heads * runner.head_dim, generator=gen, dtype=torch.float64)
    whole = runner._layer_out(x, attn, *runner._out_weights(0))
    for splits in [(2, 1), (1, 2), (2, 4)]:
        split = runner._layer_out(x, attn, *runner._out_weights(0), splits=splits)
        assert split.dtype == torch.float64
        torch.testing.assert_close(split, whole, rtol=1e-5, atol=1e-5)  # fp32 partials of a float64 model
    assert runner._splits == (1, 1)  # uncompiled (and off CUDA): no splits


def test_lean_runner_rejects_unsupported_models_with_the_reason() -> None:
    from relax.backends.embedded.lean_runner import LeanRunner

    model = _qwen3(hidden_act="gelu")
    with pytest.raises(ValueError, match="hidden_act gelu"):
        LeanRunner(model, torch.device("cpu"), slots=4, max_len=64)
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, mlp_bias=True)
    with pytest.raises(ValueError, match="gate/up projection biases"):  # the fused gate/up GEMM has no bias
        LeanRunner(transformers.LlamaForCausalLM(cfg), torch.device("cpu"), slots=4, max_len=64)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 5), st.integers(1, 700), st.integers(0, 10_000))
def test_blocked_cumsum_is_a_cumsum(rows, width, seed) -> None:
    from relax.backends.embedded.sampling import blocked_cumsum

    x = torch.rand(rows, width, generator=torch.Generator().manual_seed(seed))
    got = blocked_cumsum(x)
    assert got.shape == x.shape
    assert torch.allclose(got.double(), x.double().cumsum(-1), rtol=1e-6, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 10_000), st.sampled_from([0.0, 1.0, 1.3]), st.sampled_from([0.7, 1.0]), st.sampled_from([-1, 50]))
def test_sample_batch_over_several_scan_blocks_matches_float64_reference(seed, temperature, top_p, top_k) -> None:
    """A vocabulary of 300 spans three blocks of the CDF scan (the last one padded)."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(4, 300, generator=gen, dtype=torch.float64)
    u = torch.rand(4, generator=gen, dtype=torch.float64).float()
    tokens, lps = sample_batch(logits, torch.full((4,), temperature), torch.full((4,), top_p),
                               torch.full((4,), top_k, dtype=torch.long), u)
    for row in range(4):
        tok, lp = ref_sample(logits[row].tolist(), temperature, top_p, top_k, float(u[row]))
        assert int(tokens[row]) == tok
        assert abs(float(lps[row]) - lp) < 1e-4


def test_compiled_draw_picks_the_eager_tokens() -> None:
    from relax.backends.embedded.sampling import draw

    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(16, 1000, generator=gen) * 2
    args = (torch.full((16,), 1.0), torch.full((16,), 0.9), torch.full((16,), -1, dtype=torch.long),
            torch.arange(16) * 7919, torch.arange(16) + 5)
    eager = draw(logits, *args, filtered=True)
    compiled = torch.compile(draw, dynamic=True)(logits, *args, filtered=True)
    assert torch.equal(eager[0], compiled[0])
    assert torch.allclose(eager[1], compiled[1], atol=1e-5)


def test_lean_runner_passes_its_compile_mode_to_torch_compile(monkeypatch) -> None:
    from relax.backends.embedded.lean_runner import LeanRunner

    modes = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: modes.append(kw) or fn)
    LeanRunner(_qwen3(), torch.device("cpu"), slots=2, max_len=32, compile=True, compile_mode="max-autotune")
    assert modes == [{"mode": "max-autotune"}] * 3  # the forward, the sampler and its store (rows dynamic per call)
    modes.clear()
    LeanRunner(_qwen3(), torch.device("cpu"), slots=2, max_len=32)
    assert modes == []
