"""Routing replay (R3) on a tiny Qwen3-MoE, CPU: the engine's routed experts in SGLang's shape, the trainer's
forwards replaying them token for token, the train/rollout mismatch with and without replay, and
--use-routing-replay replaying the old pass's routing in the update; the Megatron backend's flag rules (its replay:
tests/test_megatron_routing_replay_cpu.py)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample, build_model_inputs
from relax.backends.torch.logprobs import response_log_probs
from relax.models import moe_routing
from relax.utils.arguments import parse_args
from tests.test_train_loop_flags import BASE

torch.set_num_threads(1)
EOS = 2


def tiny_moe(seed: int = 0):
    import transformers

    cfg = transformers.Qwen3MoeConfig(vocab_size=100, hidden_size=64, moe_intermediate_size=32, intermediate_size=64,
                                      num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                                      num_experts=4, num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[1],
                                      max_position_embeddings=256, pad_token_id=0, eos_token_id=EOS)
    cfg._attn_implementation = "eager"
    torch.manual_seed(seed)
    return transformers.Qwen3MoeForCausalLM(cfg).float().eval()


def nudged(model, scale: float, seed: int = 1):
    """A copy whose routers differ slightly: stands in for an inference engine's own numerics."""
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, router in moe_routing.moe_routers(other):
            router.weight.add_(torch.randn(router.weight.shape, generator=g) * scale * router.weight.abs().mean())
    return other


def requests(n: int = 6, **extra):
    g = torch.Generator().manual_seed(0)
    return [{"input_ids": torch.randint(3, 100, (int(torch.randint(2, 7, (1,), generator=g)),), generator=g).tolist(),
             "sampling_params": {"max_new_tokens": 8, "sampling_seed": i}, "return_logprob": True, **extra}
            for i in range(n)]


@pytest.mark.parametrize("runner", ["hf", "static"])
def test_engine_returns_routed_experts_for_every_fed_token(runner: str) -> None:
    model = tiny_moe()
    engine = EmbeddedEngine(model, eos_token_ids=[EOS], runner=runner)
    reqs = requests(return_routed_experts=True)
    reqs[1]["routed_experts_start_len"] = 2  # SGLang's absolute start: rows [2, seqlen - 1)
    outs = engine.generate(reqs)
    for req, out in zip(reqs, outs, strict=True):
        start = req.get("routed_experts_start_len", 0)
        seqlen = len(req["input_ids"]) + len(out["output_ids"])
        rows = moe_routing.decode(out["meta_info"]["routed_experts"], 3, 2)  # base64 int32, as SGLang sends it
        assert rows.shape == (seqlen - 1 - start, 3, 2)
        assert (rows[:, 1] == 0).all()  # the dense layer (mlp_only_layers) has zeros, as SGLang's buffer
        assert ((rows[:, [0, 2]] >= 0) & (rows[:, [0, 2]] < 4)).all()
        with moe_routing.record(model) as rec:  # the same weights' full forward routes every token alike
            model(input_ids=torch.tensor([req["input_ids"] + out["output_ids"]]))
        full = rec.forwards[0].numpy()[:-1][start:]
        assert (np.sort(full, -1) == np.sort(rows, -1)).all()
    plain = engine.generate(requests(1))[0]
    assert "routed_experts" not in plain["meta_info"]


def test_engine_refuses_routed_experts_for_a_dense_model() -> None:
    from tests.test_engine_core import tiny_model

    engine = EmbeddedEngine(tiny_model(), eos_token_ids=[EOS])
    with pytest.raises(ValueError, match="needs a MoE model"):
        engine.generate(requests(1, return_routed_experts=True))


def _mismatch(model, engine_outs, reqs, replay: bool) -> float:
    """Mean |trainer - engine| log-prob over the response tokens, the trainer replaying the engine's routing or not."""
    samples = [TrainSample(tokens=r["input_ids"] + o["output_ids"], response_length=len(o["output_ids"]),
                           loss_mask=[1] * len(o["output_ids"]), reward=0.0) for r, o in zip(reqs, engine_outs, strict=True)]
    width = max(s.response_length for s in samples)
    inputs = build_model_inputs(samples, width, 0, "cpu")
    b, seq = inputs.input_ids.shape
    experts = torch.zeros(b, seq, 3, 2, dtype=torch.int32)
    mask = torch.zeros(b, seq, dtype=torch.bool)
    for i, o in enumerate(engine_outs):
        rows = torch.from_numpy(moe_routing.decode(o["meta_info"]["routed_experts"], 3, 2))
        experts[i, :len(rows)], mask[i, :len(rows)] = rows, replay
    with torch.no_grad(), moe_routing.replay(model, experts.view(-1, 3, 2), mask.view(-1)):
        lp, _ = response_log_probs(model, inputs, temperature=1.0, with_entropy=False)
    diffs = [abs(lp[i, t].item() - o["meta_info"]["output_token_logprobs"][t][0])
             for i, o in enumerate(engine_outs) for t in range(len(o["output_ids"]))]
    return float(np.mean(diffs))


def test_replay_shrinks_the_train_rollout_mismatch() -> None:
    """Same weights, fp32: no mismatch either way. An engine whose routers differ slightly (near-tie tokens flip
    experts, as an engine's own kernels can) leaves a mismatch that replaying its routing removes."""
    model = tiny_moe()
    reqs = requests(8, return_routed_experts=True)
    same = EmbeddedEngine(model, eos_token_ids=[EOS]).generate(reqs)
    without, with_replay = _mismatch(model, same, reqs, False), _mismatch(model, same, reqs, True)
    print(f"same weights: mismatch {without:.3g} without replay, {with_replay:.3g} with")
    assert with_replay <= without + 1e-6 and without < 1e-4
    outs = EmbeddedEngine(nudged(model, 0.05), eos_token_ids=[EOS]).generate(reqs)
    without, with_replay = _mismatch(model, outs, reqs, False), _mismatch(model, outs, reqs, True)
    print(f"nudged engine routers: mismatch {without:.3g} without replay, {with_replay:.3g} with")
    assert with_replay < without / 2


def _backend(*flags: str) -> TorchTrainBackend:
    args = parse_args([*BASE, "--hf-checkpoint", "small-qwen3-moe", "--n-samples-per-prompt", "2",
                       "--rollout-batch-size", "2", "--global-batch-size", "2", "--micro-batch-size", "2", *flags])
    return TorchTrainBackend(TrainerConfig.from_args(args), "cpu")


def _selected(backend: TorchTrainBackend, monkeypatch) -> list[dict[tuple[int, ...], np.ndarray]]:
    """Per policy forward, each row's selected experts after any replay (``[len(tokens) - 1, layers, top_k]``),
    keyed by the row's tokens."""
    seen = []
    forward = backend._forward_log_probs

    def recording(model, inputs, *, with_entropy):
        if model is not backend.model:
            return forward(model, inputs, with_entropy=with_entropy)
        with moe_routing.record(model) as rec:  # registered after the replay hooks: sees their output
            out = forward(model, inputs, with_entropy=with_entropy)
        b, seq = inputs.input_ids.shape
        grid = rec.forwards[0].view(b, seq, *rec.forwards[0].shape[1:]).numpy()
        rows = {}
        for i, n in enumerate(inputs.attention_mask.sum(-1).tolist()):
            rows[tuple(inputs.input_ids[i, :n].tolist())] = grid[i, :n - 1]
        seen.append(rows)
        return out
    monkeypatch.setattr(backend, "_forward_log_probs", recording)
    return seen


def test_trainer_replays_the_engines_routing_token_for_token(monkeypatch) -> None:
    backend = _backend("--use-rollout-routing-replay", "--num-iters-per-train-update", "2")
    engine = EmbeddedEngine(nudged(backend.model, 0.2), eos_token_ids=[EOS])
    reqs = requests(4, return_routed_experts=True)
    outs = engine.generate(reqs)
    samples = [TrainSample(tokens=r["input_ids"] + o["output_ids"], response_length=len(o["output_ids"]),
                           loss_mask=[1] * len(o["output_ids"]), reward=float(i % 2),
                           rollout_log_probs=[e[0] for e in o["meta_info"]["output_token_logprobs"]],
                           routed_experts=o["meta_info"]["routed_experts"]) for i, (r, o) in enumerate(zip(reqs, outs, strict=True))]
    seen = _selected(backend, monkeypatch)
    metrics = backend.train_rollout(samples, 0)
    rows_seen = sum(len(f) for f in seen)
    assert rows_seen == 3 * len(samples)  # the old-log-prob pass and two epochs of updates
    for forward in seen:
        for tokens, got in forward.items():
            sample = next(s for s in samples if tuple(s.tokens) == tokens)
            want = moe_routing.decode(sample.routed_experts, 4, 2)
            assert (got == want).all()  # token for token, prompt and response
    # counted in the update's forwards and the old pass: router rows forced, every token but each row's last
    assert metrics["train/routing_replay_tokens"] == 3 * sum(len(s.tokens) - 1 for s in samples)
    assert metrics["train/routing_replay_changed_frac"] > 0  # the engine routed some tokens differently


def test_routing_replay_replays_the_old_pass_in_the_update(monkeypatch) -> None:
    backend = _backend("--use-routing-replay", "--num-iters-per-train-update", "2")
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample(tokens=torch.randint(3, 50, (9,), generator=g).tolist(), response_length=4,
                           loss_mask=[1] * 4, reward=float(i % 2), rollout_log_probs=[-1.0] * 4) for i in range(4)]
    columns = backend._rollout_columns

    def then_drift(*a, **kw):  # the routers move after the old pass (a stand-in for earlier updates' drift)
        out = columns(*a, **kw)
        with torch.no_grad():
            for _, router in moe_routing.moe_routers(backend.model):
                router.weight.add_(torch.randn(router.weight.shape, generator=g) * router.weight.abs().mean())
        return out
    monkeypatch.setattr(backend, "_rollout_columns", then_drift)
    seen = _selected(backend, monkeypatch)
    metrics = backend.train_rollout(samples, 0)
    old: dict = {}
    for forward in seen:  # the first time a row is seen is the old-log-prob pass: the update must route alike
        for tokens, got in forward.items():
            if tokens in old:
                assert (got == old[tokens]).all(), "an update forward routed differently from the old pass"
            else:
                old[tokens] = got
    assert len(old) == len(samples) and sum(len(f) for f in seen) == 3 * len(samples)
    assert metrics["train/routing_replay_tokens"] == 2 * len(samples) * 8  # two epochs, 8 fed tokens per row
    assert metrics["train/routing_replay_changed_frac"] > 0  # the drifted routers alone would route otherwise


def test_megatron_takes_it_with_any_recompute() -> None:
    """--train-backend megatron replays through megatron-core's RouterReplay (tests/test_megatron_routing_replay_cpu.py),
    full activation recompute included: the backward's recomputed forward replays too (REPLAY_BACKWARD)."""
    from relax.utils import validation

    args = parse_args([*BASE, "--hf-checkpoint", "small-qwen3-moe", "--use-rollout-routing-replay"])
    assert args.use_routing_replay is True
    args.train_backend = "megatron"
    for granularity in (None, "selective", "full"):
        args.recompute_granularity = granularity
        validation._routing_replay(args)
