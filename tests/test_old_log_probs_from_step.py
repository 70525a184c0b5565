"""One rollout, one optimizer step: the step's own forward stands in for the old-log-prob forward.

Checked against the step with the separate no-grad forward (``_old_log_probs_from_step`` forced off):
the same weights after the step and the same metrics (the mismatch ones computed after the step), one
model forward per micro-batch instead of two, and every condition that needs the separate forward
keeps it (torch backend, CPU, fp32).
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from tests.test_train_loop_flags import _args, _samples

ONE_STEP = ("--global-batch-size", "16")  # _samples gives 16 rows: the whole rollout is one optimizer step
torch.set_num_threads(1)


def _forwards(backend: TorchTrainBackend) -> list[int]:
    calls = [0]
    backend.model.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_same_step_as_with_the_separate_forward_and_one_forward_fewer() -> None:
    args = _args(*ONE_STEP, "--lr", "0.02")
    reused, separate = TorchTrainBackend(TrainerConfig.from_args(args), "cpu"), TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    separate._old_log_probs_from_step = lambda *a: False
    calls_reused, calls_separate = _forwards(reused), _forwards(separate)
    for step in range(2):
        samples = _samples(seed=20 + step)
        before = calls_reused[0], calls_separate[0]
        a, b = reused.train_rollout(samples, step), separate.train_rollout(samples, step)
        # one forward per micro-batch of the step; the separate path adds its no-grad forwards
        assert calls_reused[0] - before[0] == len(reused._micro_batches(samples, slice(0, 16))) == 4
        assert calls_separate[0] - before[1] == 4 + len(separate._all_micro_batches(samples, log_probs=True))
        assert a.pop("train/old_log_probs_from_step") == 1.0 and b.pop("train/old_log_probs_from_step") == 0.0
        for key in ("perf/train_columns_time_s", "perf/train_update_time_s"):
            a.pop(key), b.pop(key)
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), key
        assert a["train/ppo_kl"] == 0.0 and a["train/pg_clipfrac"] == 0.0  # ratio exactly 1
        assert "train/train_rollout_logprob_abs_diff" in a
        for (name, p), q in zip(reused.model.named_parameters(), separate.model.parameters(), strict=True):
            assert torch.allclose(p, q, rtol=1e-5, atol=1e-6), name


@pytest.mark.parametrize(("flags", "why"), [
    (("--global-batch-size", "8"), "two optimizer steps: the second needs the first's old log-probs"),
    ((*ONE_STEP, "--num-iters-per-train-update", "2"), "a second pass over the rollout"),
    ((*ONE_STEP, "--use-kl-loss", "--kl-loss-coef", "0.05"), "a reference model"),
    ((*ONE_STEP, "--advantage-estimator", "ppo"), "a critic"),
])
def test_conditions_that_need_the_separate_forward_keep_it(flags, why) -> None:
    metrics = TorchTrainBackend(TrainerConfig.from_args(_args(*flags)), "cpu").train_rollout(_samples(seed=30), 0)
    assert metrics["train/old_log_probs_from_step"] == 0.0, why


def test_rollout_data_hook_keeps_the_separate_forward(tmp_path, monkeypatch) -> None:
    (tmp_path / "hook_mod.py").write_text("def hook(args, rollout_id, data):\n    return None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    args = _args(*ONE_STEP, "--rollout-data-postprocess-path", "hook_mod.hook")
    assert TorchTrainBackend(TrainerConfig.from_args(args), "cpu").train_rollout(_samples(seed=31), 0)["train/old_log_probs_from_step"] == 0.0
