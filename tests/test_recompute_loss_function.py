"""--recompute-loss-function: the loss part runs under activation checkpointing; same loss and gradients."""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from tests.test_train_loop_flags import _args, _samples


def _backend(*flags: str) -> TorchTrainBackend:
    return TorchTrainBackend(TrainerConfig.from_args(_args("--lr", "0.05", *flags)), "cpu")


def _grads_and_metrics(backend: TorchTrainBackend, steps: int = 2):
    """Each optimizer step's gradients (captured before the update) and each rollout's metrics."""
    grads: list[list[torch.Tensor]] = []
    original = backend._apply_gradients

    def spy(loss):
        grads.append([p.grad.clone() for p in backend.model.parameters() if p.grad is not None])
        return original(loss)

    backend._apply_gradients = spy
    metrics = [backend.train_rollout(_samples(seed=40 + step), step) for step in range(steps)]
    return grads, metrics


@pytest.mark.parametrize("extra", [(), ("--log-probs-chunk-size", "5")])
def test_same_loss_and_gradients_and_the_loss_runs_twice(extra: tuple[str, ...]) -> None:
    plain = _backend(*extra)
    grads, metrics = _grads_and_metrics(plain)
    assert plain.loss_function_runs == 0
    recomputed = _backend("--recompute-loss-function", *extra)
    grads_r, metrics_r = _grads_and_metrics(recomputed)
    assert len(grads) == len(grads_r) == 4  # two rollouts of two optimizer steps
    for a, b in zip(grads, grads_r, strict=True):
        assert len(a) == len(b) and len(a) > 0
        for x, y in zip(a, b, strict=True):
            assert torch.allclose(x, y, rtol=1e-6, atol=1e-9)
    for m, mr in zip(metrics, metrics_r, strict=True):
        for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
            assert mr[key] == pytest.approx(m[key], rel=1e-6, abs=1e-9), key
    for p, q in zip(plain.model.parameters(), recomputed.model.parameters(), strict=True):
        assert torch.allclose(p, q, rtol=1e-6, atol=1e-8)
    # 16 samples per rollout in micro-batches of 4: 4 micro-batches, each loss once forward, once in the backward
    assert recomputed.loss_function_runs == 2 * 4 * 2
