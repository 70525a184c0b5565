"""Training-loop flags shared by every train backend (CPU, torch backend, fp32).

- ``--use-dynamic-batch-size`` / ``--max-tokens-per-gpu``: packing by token count changes the
  micro-batch split, never the loss or the gradients (the reducers divide by the optimizer
  step's totals).
- ``--log-probs-chunk-size``: chunked log-probs / entropy / their gradients equal unchunked.
- ``--only-train-params-name-list`` / ``--freeze-params-name-list``: frozen weights stay
  bitwise unchanged, the others train; bad patterns fail with a message naming them.
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample, build_model_inputs, build_rollout_tensors
from relax.backends.torch.freezing import apply_param_freezing
from relax.backends.torch.logprobs import log_probs_from_logits
from relax.backends.torch.micro_batches import token_budget_micro_batches
from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError

# 16 samples per rollout, two optimizer steps of 8, fixed micro-batches of 4.
BASE = ["--preset", "quickstart", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
        "--global-batch-size", "8", "--micro-batch-size", "4", "--seed", "3"]


def _args(*flags: str):
    return parse_args([*BASE, *flags])


def _samples(seed: int, n: int = 16, vocab: int = 100) -> list[TrainSample]:
    """Random prompts and responses of varied lengths (some responses empty), random rewards and masks."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        prompt_len = int(torch.randint(2, 9, (1,), generator=g))
        resp_len = int(torch.randint(0, 7, (1,), generator=g))
        tokens = torch.randint(1, vocab, (prompt_len + resp_len,), generator=g).tolist()
        mask = (torch.rand(resp_len, generator=g) > 0.2).int().tolist()
        rollout_lp = (-torch.rand(resp_len, generator=g)).tolist()
        out.append(TrainSample(tokens=tokens, response_length=resp_len, loss_mask=mask,
                               reward=float(torch.randint(0, 2, (1,), generator=g)), rollout_log_probs=rollout_lp))
    return out


def _train(args, rollouts: int = 2) -> tuple[TorchTrainBackend, list[dict[str, float]], list[dict[str, torch.Tensor]]]:
    """Train ``rollouts`` RL steps; returns the backend, each step's metrics and every optimizer step's gradients."""
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    grads: list[dict[str, torch.Tensor]] = []
    apply = backend._apply_gradients

    def capture(loss):
        grads.append({n: p.grad.clone() for n, p in backend.model.named_parameters() if p.grad is not None})
        return apply(loss)

    backend._apply_gradients = capture
    metrics = [backend.train_rollout(_samples(seed=10 + step), step) for step in range(rollouts)]
    return backend, metrics, grads


def _assert_close_runs(a, b, *, tol: float = 1e-6, weight_tol: float = 1e-6) -> None:
    """Every logged metric of every step and every optimizer step's gradients within ``tol``;
    the final weights within ``weight_tol``."""
    (ba, ma, ga), (bb, mb, gb) = a, b
    assert ma[0].keys() == mb[0].keys()
    for step, (x, y) in enumerate(zip(ma, mb, strict=True)):
        for key in x:
            if key.startswith("perf/"):  # phase timings differ run to run
                continue
            assert abs(x[key] - y[key]) < tol, f"step {step} {key}: {x[key]} vs {y[key]}"
    assert len(ga) == len(gb) == 4  # 2 rollouts x 2 optimizer steps
    for i, (x, y) in enumerate(zip(ga, gb, strict=True)):
        assert x.keys() == y.keys()
        for name in x:
            diff = float((x[name] - y[name]).abs().max())
            assert diff < tol, f"optimizer step {i} grad {name}: max |diff| {diff}"
    for (name, p), q in zip(ba.model.named_parameters(), bb.model.parameters(), strict=True):
        assert float((p - q).detach().abs().max()) < weight_tol, name


# ---------------------------------------------------------------------- packing
def test_token_budget_packs_in_order_within_budget() -> None:
    lengths = [3, 3, 3, 10, 2, 2, 2, 2, 2]
    parts = token_budget_micro_batches(lengths, 0, 9, max_tokens=6)
    assert parts == [slice(0, 2), slice(2, 3), slice(3, 4), slice(4, 7), slice(7, 9)]
    for sl in parts:
        rows = lengths[sl]
        assert len(rows) == 1 or len(rows) * max(rows) <= 6  # the 10-token sample sits alone
    assert token_budget_micro_batches(lengths, 2, 9, max_tokens=1000) == [slice(2, 9)]
    assert token_budget_micro_batches(lengths, 4, 4, max_tokens=6) == []


def test_dynamic_split_really_differs_from_fixed() -> None:
    samples = _samples(seed=10)
    dyn = TorchTrainBackend(TrainerConfig.from_args(_args("--use-dynamic-batch-size", "--max-tokens-per-gpu", "24")), "cpu")
    fixed = TorchTrainBackend(TrainerConfig.from_args(_args()), "cpu")
    d, f = dyn._all_micro_batches(samples), fixed._all_micro_batches(samples)
    assert f == [slice(i, i + 4) for i in range(0, 16, 4)]
    assert d != f and len({sl.stop - sl.start for sl in d}) > 1
    assert not any(sl.start < 8 < sl.stop for sl in d), "a micro-batch crosses an optimizer step"
    lengths = [len(s.tokens) for s in samples]
    for sl in d:
        assert sl.stop - sl.start == 1 or (sl.stop - sl.start) * max(lengths[sl]) <= 24


# ---------------------------------------------------------------------- dynamic batching invariance
LOSSES = pytest.mark.parametrize("extra", [[], ["--calculate-per-token-loss"], ["--use-kl-loss", "--kl-loss-coef", "0.1"]],
                                 ids=["sample-mean", "per-token", "kl-loss"])


@LOSSES
@pytest.mark.parametrize("max_tokens", ["7", "24", "60"])
def test_dynamic_batching_gives_the_same_gradients(extra: list[str], max_tokens: str) -> None:
    """``--lr 0``: every optimizer step starts from the same weights in both runs, so the gradients
    of all four steps (both rollouts, both global batches) are compared like for like."""
    fixed = _train(_args(*extra, "--lr", "0"))
    dynamic = _train(_args(*extra, "--lr", "0", "--use-dynamic-batch-size", "--max-tokens-per-gpu", max_tokens))
    _assert_close_runs(fixed, dynamic, weight_tol=1e-12)
    assert any(float(g.abs().max()) > 1e-3 for g in fixed[2][3].values()), "vacuous: no gradient"


@LOSSES
def test_dynamic_batching_gives_the_same_trajectory(extra: list[str]) -> None:
    """Real updates (lr 3e-3). Metrics and gradients stay within 1e-6; the weights within 1e-4, because
    Adam divides each element's update by its own gradient scale, which lifts float-rounding
    differences of near-zero gradient elements (|g| ~ eps = 1e-8) to ~1e-5 of weight."""
    fixed = _train(_args(*extra))
    dynamic = _train(_args(*extra, "--use-dynamic-batch-size", "--max-tokens-per-gpu", "24"))
    _assert_close_runs(fixed, dynamic, tol=1e-5, weight_tol=1e-4)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        for x, y in zip(fixed[1], dynamic[1], strict=True):
            assert abs(x[key] - y[key]) < 1e-6, key


def test_dynamic_batching_covers_the_ppo_critic() -> None:
    """The critic's values and value loss use the same token-budget split and the step's totals."""
    flags = ("--advantage-estimator", "ppo", "--lr", "0")
    fixed = _train(_args(*flags))
    dynamic = _train(_args(*flags, "--use-dynamic-batch-size", "--max-tokens-per-gpu", "24"))
    assert any(k.startswith("train/value") or "critic" in k for k in fixed[1][0])
    _assert_close_runs(fixed, dynamic)


def test_separate_log_probs_budget_still_matches() -> None:
    fixed = _train(_args("--lr", "0"))
    dynamic = _train(_args("--lr", "0", "--use-dynamic-batch-size", "--max-tokens-per-gpu", "24",
                           "--log-probs-max-tokens-per-gpu", "100"))
    _assert_close_runs(fixed, dynamic)


def test_dynamic_batching_keeps_step0_ppo_kl_exactly_zero() -> None:
    """Old log-probs use the train forward's split (same budget), so the first ratio is exactly 1."""
    backend = TorchTrainBackend(TrainerConfig.from_args(_args("--global-batch-size", "16", "--use-dynamic-batch-size",
                                      "--max-tokens-per-gpu", "24")), "cpu")
    assert backend.train_rollout(_samples(seed=10), 0)["train/ppo_kl"] == 0.0


# ---------------------------------------------------------------------- chunked log-probs
@pytest.mark.parametrize("chunk", [1, 3, 5, 1000])
def test_chunked_log_probs_equal_unchunked_with_gradients(chunk: int) -> None:
    torch.manual_seed(0)
    samples = _samples(seed=4, n=6, vocab=30)
    width = build_rollout_tensors(samples).loss_mask.shape[1]
    inputs = build_model_inputs(samples, width, pad_id=0, device="cpu")
    logits = torch.randn(*inputs.input_ids.shape, 30, dtype=torch.float32)
    weights = torch.randn(inputs.valid.shape)
    results = []
    for size in (-1, chunk):
        leaf = logits.clone().requires_grad_(True)
        lp, ent = log_probs_from_logits(leaf, inputs, temperature=0.7, with_entropy=True, chunk_size=size)
        ((lp * weights).sum() + (ent * weights).sum()).backward()
        results.append((lp.detach(), ent.detach(), leaf.grad))
        with torch.no_grad():
            lp_ng, _ = log_probs_from_logits(logits, inputs, temperature=0.7, with_entropy=False, chunk_size=size)
        assert torch.equal(lp_ng, lp.detach())
    (lp0, ent0, g0), (lp1, ent1, g1) = results
    assert torch.equal(lp0, lp1) and torch.equal(ent0, ent1)
    assert float((g0 - g1).abs().max()) < 1e-6
    assert bool((lp0[~inputs.valid] == 0).all()) and bool((lp0[inputs.valid] < 0).all())


def test_chunked_log_probs_train_identically() -> None:
    plain = _train(_args("--use-kl-loss", "--kl-loss-coef", "0.1"))
    chunked = _train(_args("--use-kl-loss", "--kl-loss-coef", "0.1", "--log-probs-chunk-size", "5"))
    _assert_close_runs(plain, chunked, tol=1e-7, weight_tol=1e-7)


# ---------------------------------------------------------------------- freezing
def _snapshot(backend: TorchTrainBackend) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in backend.model.named_parameters()}


@pytest.mark.parametrize(("flags", "frozen_re"), [
    (["--freeze-params-name-list", "embed_tokens", r"layers\.0\."], r"embed_tokens|layers\.0\."),
    (["--only-train-params-name-list", r"layers\.1\.mlp"], r"^(?!.*layers\.1\.mlp)"),
    (["--freeze-params-name-list", "lm_head"], "embed_tokens"),  # tied: lm_head.weight is embed_tokens.weight
])
def test_frozen_params_stay_bitwise_unchanged(flags: list[str], frozen_re: str) -> None:
    import re

    backend = TorchTrainBackend(TrainerConfig.from_args(_args(*flags)), "cpu")
    before = _snapshot(backend)
    frozen = {n for n in before if re.search(frozen_re, n)}
    assert frozen and len(frozen) < len(before)
    assert {n for n, p in backend.model.named_parameters() if not p.requires_grad} == frozen
    in_optimizer = {id(p) for group in backend.optimizer.param_groups for p in group["params"]}
    assert {n for n, p in backend.model.named_parameters() if id(p) not in in_optimizer} == frozen
    for step in range(2):
        backend.train_rollout(_samples(seed=20 + step), step)
    after = _snapshot(backend)
    for name in before:
        if name in frozen:
            assert torch.equal(before[name], after[name]), f"frozen {name} changed"
    changed = [n for n in before if n not in frozen and not torch.equal(before[n], after[n])]
    assert len(changed) >= len(before) - len(frozen) - 2, changed  # (a norm weight may see zero grad)


def test_pattern_matching_nothing_names_it() -> None:
    with pytest.raises(ConfigError, match=r"--freeze-params-name-list: pattern\(s\) \['no_such_param'\] match no"):
        TorchTrainBackend(TrainerConfig.from_args(_args("--freeze-params-name-list", "embed", "no_such_param")), "cpu")
    with pytest.raises(ConfigError, match=r"--only-train-params-name-list: pattern\(s\) \['nope'\]"):
        TorchTrainBackend(TrainerConfig.from_args(_args("--only-train-params-name-list", "nope")), "cpu")


def test_freezing_everything_or_both_lists_is_an_error() -> None:
    with pytest.raises(ConfigError, match="leaves no parameter to train"):
        TorchTrainBackend(TrainerConfig.from_args(_args("--freeze-params-name-list", ".")), "cpu")
    with pytest.raises(ConfigError, match="cannot be used together"):
        _args("--only-train-params-name-list", "a", "--freeze-params-name-list", "b")
    with pytest.raises(ConfigError, match="cannot be used together"):
        apply_param_freezing(torch.nn.Linear(2, 2), ["a"], ["b"])


# ---------------------------------------------------------------------- parse-time rules
@pytest.mark.parametrize(("flags", "message"), [
    # without --use-dynamic-batch-size it budgets the log-prob passes (seed 004): tests/test_launch_checks.py
    (["--max-tokens-per-gpu", "0"], "^--max-tokens-per-gpu must be >= 1, got 0$"),
    (["--use-dynamic-batch-size", "--max-tokens-per-gpu", "8", "--log-probs-max-tokens-per-gpu", "0"],
     "^--log-probs-max-tokens-per-gpu must be >= 1, got 0$"),
    (["--log-probs-chunk-size", "0"], r"^--log-probs-chunk-size must be -1 \(off\) or >= 1, got 0$"),
    (["--freeze-params-name-list", "a("], "^--freeze-params-name-list: 'a\\(' is not a valid regex"),
])
def test_parse_time_rules(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _args(*flags)
