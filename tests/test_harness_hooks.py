"""The planted-defect hooks (relax/utils/fault_hooks.py) at their call sites, and the trainer's step report
(relax/backends/torch/step_report.py) against float64 references."""

from __future__ import annotations

import threading

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.torch.step_report import consumed_samples, logprob_mismatch_metrics
from relax.utils import fault_hooks
from relax.utils.fault_hooks import DECODE_SKEW, EngineHooks

torch.set_num_threads(1)


def tiny_engine() -> EmbeddedEngine:
    import transformers

    cfg = transformers.Qwen3Config(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                                   max_position_embeddings=128, pad_token_id=0, eos_token_id=2)
    cfg._attn_implementation = "eager"
    torch.manual_seed(0)
    return EmbeddedEngine(transformers.Qwen3ForCausalLM(cfg).float().eval(), eos_token_ids=[], runner="hf")


def generate(engine: EmbeddedEngine) -> dict:
    req = {"input_ids": [5, 6, 7], "sampling_params": {"max_new_tokens": 12, "sampling_seed": 3}, "return_logprob": True}
    return engine.generate([req])[0]


def test_hooks_are_off_unless_set_and_refuse_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fault_hooks.ENGINE_SLOWDOWN_ENV, raising=False)
    monkeypatch.delenv(fault_hooks.DECODE_SKEW_ENV, raising=False)
    assert EngineHooks.from_env() == EngineHooks(slowdown=0.0, skew_from=None)
    monkeypatch.setenv(fault_hooks.ENGINE_SLOWDOWN_ENV, "fast")
    with pytest.raises(ValueError, match=r"RELAX_FAULT_ENGINE_SLOWDOWN='fast': expected a float >= 0"):
        EngineHooks.from_env()
    monkeypatch.setenv(fault_hooks.ENGINE_SLOWDOWN_ENV, "0.3")
    monkeypatch.setenv(fault_hooks.DECODE_SKEW_ENV, "8")
    assert EngineHooks.from_env() == EngineHooks(slowdown=0.3, skew_from=8)
    assert fault_hooks.fault_at("TRAINER_DROP_SAMPLE", 1) is False


def test_decode_skew_touches_only_generated_positions_from_n(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(fault_hooks.DECODE_SKEW_ENV, raising=False)
    clean = generate(tiny_engine())
    monkeypatch.setenv(fault_hooks.DECODE_SKEW_ENV, "8")
    skewed = generate(tiny_engine())
    assert skewed["output_ids"] == clean["output_ids"]  # the tokens are the same; only the reported log-probs lie
    diffs = [s[0] - c[0] for s, c in zip(skewed["meta_info"]["output_token_logprobs"],
                                         clean["meta_info"]["output_token_logprobs"], strict=True)]
    assert diffs[:8] == [0.0] * 8 and diffs[8:] == pytest.approx([DECODE_SKEW] * 4)


def test_slowdown_sleeps_a_fraction_of_each_engine_step(monkeypatch: pytest.MonkeyPatch) -> None:
    naps: list[float] = []
    monkeypatch.setattr(fault_hooks.time, "sleep", naps.append)
    monkeypatch.setenv(fault_hooks.ENGINE_SLOWDOWN_ENV, "0.3")
    engine = tiny_engine()
    steps = 0
    real_step = engine.step

    def counted():
        nonlocal steps
        steps += 1
        return real_step()

    engine.step = counted
    generate(engine)
    assert steps > 1 and len(naps) == steps and all(n > 0 for n in naps)  # one nap per engine step
    monkeypatch.setenv(fault_hooks.ENGINE_SLOWDOWN_ENV, "0")
    naps.clear()
    generate(tiny_engine())
    assert naps == []


def test_mismatch_metrics_match_a_float64_reference() -> None:
    g = torch.Generator().manual_seed(0)
    trainer = -torch.rand(6, 9, generator=g) * 5
    rollout = trainer + torch.randn(6, 9, generator=g) * 1e-3
    mask = (torch.rand(6, 9, generator=g) > 0.3).float()
    got = logprob_mismatch_metrics(trainer, rollout, mask)
    gap = [(float(t) - float(r)) for t, r, m in zip(trainer.flatten(), rollout.flatten(), mask.flatten(), strict=True)
           if m > 0]
    absolute = sorted(abs(x) for x in gap)
    rank = -(-99 * len(absolute) // 100)  # nearest-rank p99
    assert got["train/train_rollout_logprob_abs_diff"] == pytest.approx(sum(absolute) / len(absolute), rel=1e-6)
    assert got["train/train_rollout_logprob_abs_diff_max"] == pytest.approx(absolute[-1], rel=1e-6)
    assert got["train/train_rollout_logprob_abs_diff_p99"] == pytest.approx(absolute[rank - 1], rel=1e-6)
    assert got["train/train_rollout_kl"] == pytest.approx(-sum(gap) / len(gap), rel=1e-5)
    assert logprob_mismatch_metrics(trainer, rollout, torch.zeros_like(mask)) == {}


def test_consumed_samples_lists_rows_the_loss_saw() -> None:
    ids = [(0, 0), (0, 1), None, (1, 3)]
    assert consumed_samples(ids, torch.tensor([2.0, 0.0, 2.0, 2.0])) == [[0, 0, 2], [1, 3, 2]]


def _samples(n: int, with_ids: bool = True):
    from relax.backends.torch.batch import TrainSample

    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        tokens = torch.randint(3, 90, (7,), generator=g).tolist()
        out.append(TrainSample(tokens=tokens, response_length=4, loss_mask=[1] * 4, reward=float(i % 2),
                               rollout_log_probs=[-1.0] * 4, sample_id=(i // 2, i) if with_ids else None))
    return out


def test_trainer_reports_what_it_consumed_and_the_planted_drop(monkeypatch: pytest.MonkeyPatch) -> None:
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.backends.torch.step_report import CONSUMED_KEY
    from relax.utils.arguments import parse_args

    args = parse_args(["--preset", "quickstart", "--rollout-batch-size", "4", "--n-samples-per-prompt", "2",
                       "--global-batch-size", "8", "--micro-batch-size", "4", "--num-iters-per-train-update", "2"])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    metrics = backend.train_rollout(_samples(8), 0)
    assert metrics[CONSUMED_KEY] == [[i // 2, i, 2] for i in range(8)]  # two PPO epochs, every row twice
    assert "train/train_rollout_logprob_abs_diff_max" in metrics
    assert CONSUMED_KEY not in backend.train_rollout(_samples(8, with_ids=False), 1)
    monkeypatch.setenv("RELAX_FAULT_TRAINER_DROP_SAMPLE_AT_STEP", "2")
    consumed = backend.train_rollout(_samples(8), 2)[CONSUMED_KEY]
    assert [row[1] for row in consumed] == [0, 1, 2, 3, 4, 5, 6]  # the last row never reached the loss


def test_machine_lock_gives_a_timed_scenario_the_machine(tmp_path) -> None:
    from harness.machine_lock import machine_lock

    order: list[str] = []
    inside = threading.Event()
    release = threading.Event()

    def timed() -> None:
        with machine_lock(tmp_path, exclusive=True):
            order.append("exclusive in")
            inside.set()
            release.wait(5)
            order.append("exclusive out")

    t = threading.Thread(target=timed)
    t.start()
    inside.wait(5)
    other = threading.Thread(target=lambda: (machine_lock(tmp_path, exclusive=False).__enter__(),
                                             order.append("shared in")))
    other.start()
    other.join(0.2)
    assert order == ["exclusive in"]  # the shared one waits while the timed scenario runs
    release.set()
    t.join(5)
    other.join(5)
    assert order == ["exclusive in", "exclusive out", "shared in"]
