"""--lr-decay-style: each optimizer step's rate, against the closed forms, and through a run."""

from __future__ import annotations

import math

import pytest

from relax.backends.config import TrainerConfig
from relax.backends.lr_schedule import LRSchedule
from relax.utils.arguments import ConfigError, parse_args
from relax.utils.presets import QUICKSTART

QUICK = ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
         "--global-batch-size", "16", "--micro-batch-size", "16", "--num-rollout", "10", "--lr", "0.002"]


@pytest.mark.parametrize("style", ["constant", "linear", "cosine"])
def test_the_rate_of_every_step_follows_its_closed_form(style: str) -> None:
    schedule = LRSchedule.of(TrainerConfig.from_args(parse_args([*QUICK, "--lr-decay-style", style])))
    assert (schedule.steps_per_rollout, schedule.total_steps) == (2, 20)  # 32 samples / 16 per optimizer step
    for step in range(10):
        for k in range(2):
            done = (2 * step + k) / 20
            expected = {"constant": 0.002, "linear": 0.002 * (1 - done),
                        "cosine": 0.002 * 0.5 * (1 + math.cos(math.pi * done))}[style]
            assert schedule.lr_at(step, k) == pytest.approx(expected, rel=1e-12, abs=0)
    assert schedule.lr_at(0, 0) == pytest.approx(0.002)


def test_refusals() -> None:
    with pytest.raises(ConfigError, match="not supported yet: --lr-decay-style"):
        parse_args([*QUICK, "--lr-decay-style", "WSD"])
    with pytest.raises(ConfigError, match="--lr-decay-style cosine needs --num-rollout"):
        parse_args(["--train-backend", "torch", "--hf-checkpoint", "tiny-qwen3", "--prompt-data", QUICKSTART["prompt_data"],
                    "--num-epoch", "1", "--lr-decay-style", "cosine"])


def test_the_trainer_logs_the_decayed_rate(tmp_path) -> None:
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.backends.torch.batch import TrainSample

    args = parse_args([*QUICK, "--lr-decay-style", "linear"])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    samples = [TrainSample(tokens=[5, 6, 7, 8], response_length=2, loss_mask=[1, 1], reward=float(i % 2))
               for i in range(32)]
    lrs = [backend.train_rollout(samples, step)["train/lr"] for step in (0, 5)]
    assert lrs == pytest.approx([0.002 * (1 - 1 / 20), 0.002 * (1 - 11 / 20)])  # the last step of each rollout
