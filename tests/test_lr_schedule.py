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


def closed_form(style: str, step: int, total: int, lr: float, wsd: tuple[int, str] | None = None) -> float:
    """Megatron-LM's rate at ``num_steps = step`` (no warm-up, min_lr 0), written out per style."""
    done = step / total
    if style == "WSD":
        iters, shape = wsd
        if step <= total - iters:
            return lr
        d = (step - (total - iters)) / iters
        return lr * {"linear": 1 - d, "cosine": 0.5 * (1 + math.cos(math.pi * d)), "exponential": 2 * 0.5 ** d - 1,
                     "minus_sqrt": 1 - math.sqrt(d)}[shape]
    return {"constant": lr, "linear": lr * (1 - done), "cosine": lr * 0.5 * (1 + math.cos(math.pi * done)),
            "inverse-square-root": lr / math.sqrt(max(step, 1))}[style]


STYLE_FLAGS = {
    "constant": [], "linear": [], "cosine": [], "inverse-square-root": [],
    **{f"WSD-{shape}": ["--lr-wsd-decay-iters", "6", "--lr-wsd-decay-style", shape]
       for shape in ("exponential", "linear", "cosine", "minus_sqrt")},
}


def schedule_of(case: str) -> LRSchedule:
    style = case.split("-")[0] if case.startswith("WSD") else case
    return LRSchedule.of(TrainerConfig.from_args(parse_args([*QUICK, "--lr-decay-style", style, *STYLE_FLAGS[case]])))


@pytest.mark.parametrize("case", list(STYLE_FLAGS))
def test_the_rate_of_every_step_follows_its_closed_form(case: str) -> None:
    schedule = schedule_of(case)
    assert (schedule.steps_per_rollout, schedule.total_steps) == (2, 20)  # 32 samples / 16 per optimizer step
    wsd = (6, case.split("-", 1)[1]) if case.startswith("WSD") else None
    rates = [schedule.lr_at(step, k) for step in range(10) for k in range(2)]
    assert rates == [pytest.approx(closed_form(schedule.style, g, 20, 0.002, wsd), rel=1e-12, abs=0) for g in range(20)]
    assert rates[0] == pytest.approx(0.002)
    if case != "constant":  # decays: never up, and the last step's rate is below the first's
        assert all(b <= a for a, b in zip(rates, rates[1:], strict=False)) and rates[-1] < rates[0]
    if wsd:  # stable through step 14 (20 - 6), annealing over the last 6
        assert set(rates[:15]) == {0.002} and rates[15] < 0.002


@pytest.mark.megatron
@pytest.mark.parametrize("case", list(STYLE_FLAGS))
def test_every_style_gives_megatron_cores_own_rates(case: str) -> None:
    """Against the reference itself: megatron-core's OptimizerParamScheduler stepped as Megatron-LM's loop steps
    it (the g-th optimizer step runs with the rate set at num_steps = g)."""
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    import torch
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler

    schedule = schedule_of(case)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=schedule.lr)
    reference = OptimizerParamScheduler(
        optimizer, init_lr=0.0, max_lr=schedule.lr, min_lr=0.0, lr_warmup_steps=0,
        lr_decay_steps=schedule.total_steps, lr_decay_style=schedule.style, start_wd=0.0, end_wd=0.0,
        wd_incr_steps=schedule.total_steps, wd_incr_style="constant", wsd_decay_steps=schedule.wsd_decay_steps,
        lr_wsd_decay_style=schedule.wsd_style)
    for g in range(schedule.total_steps):
        assert schedule.lr_at(g // 2, g % 2) == pytest.approx(optimizer.param_groups[0]["lr"], rel=1e-12, abs=0), g
        reference.step(1)


@pytest.mark.parametrize("flags, message", [
    (["--lr-decay-style", "WSD"], "--lr-decay-style WSD needs --lr-wsd-decay-iters"),
    (["--lr-wsd-decay-iters", "4"], "--lr-wsd-decay-iters applies to --lr-decay-style WSD only"),
    (["--lr-decay-style", "linear", "--lr-wsd-decay-style", "cosine"],
     "--lr-wsd-decay-style applies to --lr-decay-style WSD only"),
    (["--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "0"], "--lr-wsd-decay-iters must be >= 1"),
])
def test_wsd_flags_refused_where_they_cannot_act(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*QUICK, *flags])


def test_refusals() -> None:
    with pytest.raises(ConfigError, match="--lr-decay-style cosine needs --num-rollout"):
        parse_args(["--train-backend", "torch", "--hf-checkpoint", "tiny-qwen3", "--prompt-data", QUICKSTART["prompt_data"],
                    "--num-epoch", "1", "--lr-decay-style", "cosine"])


@pytest.mark.parametrize("case", ["linear", "inverse-square-root", "WSD-cosine"])
def test_the_trainer_steps_with_the_scheduled_rate(case: str) -> None:
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.backends.torch.batch import TrainSample

    schedule = schedule_of(case)
    style = schedule.style
    args = parse_args([*QUICK, "--lr-decay-style", style, *STYLE_FLAGS[case]])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    samples = [TrainSample(tokens=[5, 6, 7, 8], response_length=2, loss_mask=[1, 1], reward=float(i % 2))
               for i in range(32)]
    for step in (0, 9):  # the log and Adam's groups hold the rate of each rollout's last optimizer step
        assert backend.train_rollout(samples, step)["train/lr"] == pytest.approx(schedule.lr_at(step, 1), rel=1e-12)
        assert [g["lr"] for g in backend.optimizer.param_groups] == pytest.approx(
            [schedule.lr_at(step, 1)] * len(backend.optimizer.param_groups), rel=1e-12)
    if case == "linear":
        assert schedule.lr_at(0, 1) == pytest.approx(0.002 * (1 - 1 / 20))
    if case == "WSD-cosine":  # step 19 of 20 is the anneal's 5th of 6
        assert schedule.lr_at(9, 1) == pytest.approx(0.002 * 0.5 * (1 + math.cos(math.pi * 5 / 6)))
