"""``--num-iters-per-train-update N``: N passes of optimizer steps over one rollout batch (torch backend, CPU, fp32).

Checked against an explicit reference loop built from the backend's parts: old/ref log-probs and
advantages computed once, then the same ``_optimizer_step`` calls over the global batches, N times.
N = 1 is the step as it was before the flag existed.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from relax.algorithms import compute_advantages
from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import build_rollout_tensors
from relax.utils.flag_types import ConfigError
from tests.metric_helpers import no_timings
from tests.test_train_loop_flags import _args, _samples

KL = ("--use-kl-loss", "--kl-loss-coef", "0.05")
torch.set_num_threads(1)  # the CI machine has 2 cores shared by two test workers


def _reference_step(backend: TorchTrainBackend, samples, iters: int) -> list[dict[str, float]]:
    """Old/ref log-probs and advantages once, then ``iters`` passes of the optimizer steps; per-step metrics."""
    batch = build_rollout_tensors(samples)
    old = backend._log_probs_no_grad(backend.model, batch)
    ref = backend._log_probs_no_grad(backend.ref_model, batch) if backend.ref_model is not None else None
    adv = compute_advantages(backend.algo, rewards=batch.rewards, loss_mask=batch.loss_mask,
                             group_size=backend.cfg.n_samples_per_prompt, old_log_probs=old, ref_log_probs=ref)
    gbs = backend.cfg.global_batch_size
    return [backend._optimizer_step(batch, slice(i, i + gbs), old, ref, adv.advantages)
            for _ in range(iters) for i in range(0, len(samples), gbs)]


def _assert_same_weights(a: TorchTrainBackend, b: TorchTrainBackend) -> None:
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters(), strict=True):
        assert torch.equal(p, q), name


@pytest.mark.parametrize("iters", [1, 2, 3])
@pytest.mark.parametrize("extra", [(), KL], ids=["grpo", "kl-loss"])
def test_iterations_equal_the_reference_loop(iters: int, extra: tuple[str, ...]) -> None:
    args = _args(*extra, "--lr", "0.02", "--num-iters-per-train-update", str(iters))
    trained, reference = TorchTrainBackend(TrainerConfig.from_args(args), "cpu"), TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    for step in range(2):
        samples = _samples(seed=10 + step)
        metrics = trained.train_rollout(samples, step)
        per_step = _reference_step(reference, samples, iters)
        assert metrics["train/num_optimizer_steps"] == len(per_step) == 2 * iters
        for key in per_step[0]:
            assert metrics[f"train/{key}"] == float(np.mean([m[key] for m in per_step])), (step, key)
        _assert_same_weights(trained, reference)
    if iters > 1:  # the later passes really train off-policy against the fixed old log-probs
        later = per_step[2:]
        assert all(m["ppo_kl"] != 0.0 for m in later)
        assert any(m["pg_clipfrac"] > 0.0 for m in later)


def test_one_iteration_is_the_default_step() -> None:
    """N = 1 (the default) and an explicit 1 give bitwise the same step; first-step ratio is exactly 1."""
    a = TorchTrainBackend(TrainerConfig.from_args(_args(*KL)), "cpu")
    b = TorchTrainBackend(TrainerConfig.from_args(_args(*KL, "--num-iters-per-train-update", "1")), "cpu")
    ma, mb = a.train_rollout(_samples(seed=10), 0), b.train_rollout(_samples(seed=10), 0)
    assert no_timings(ma) == no_timings(mb) and ma["train/num_optimizer_steps"] == 2.0  # perf/: timings
    _assert_same_weights(a, b)
    single = TorchTrainBackend(TrainerConfig.from_args(_args(*KL, "--global-batch-size", "16")), "cpu").train_rollout(_samples(seed=10), 0)
    assert single["train/ppo_kl"] == 0.0


def test_ppo_critic_steps_repeat_too() -> None:
    args = _args("--advantage-estimator", "ppo", "--num-iters-per-train-update", "2")
    metrics = TorchTrainBackend(TrainerConfig.from_args(args), "cpu").train_rollout(_samples(seed=10), 0)
    assert metrics["train/num_optimizer_steps"] == 4.0
    assert "train/value_loss" in metrics and "train/critic_grad_norm" in metrics


def test_must_be_positive() -> None:
    with pytest.raises(ConfigError, match=r"--num-iters-per-train-update must be >= 1, got 0"):
        _args("--num-iters-per-train-update", "0")
