"""--optimizer sgd / --sgd-momentum on the torch backend (policy and critic): SGD's own update is what steps the
weights, its momentum survives a checkpoint, and optimizer state saved by the other --optimizer is refused. The
Megatron backend's twin is tests/megatron_rl_flag_checks.py's check_sgd_*."""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.optimizer import check_saved_state, saved_kind
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample
from relax.utils.arguments import ConfigError, parse_args

ONE_STEP = ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
            "--global-batch-size", "32", "--micro-batch-size", "16", "--num-rollout", "4", "--lr", "0.05"]
SGD = ("--optimizer", "sgd", "--sgd-momentum", "0.5")


def backend(*extra: str) -> TorchTrainBackend:
    return TorchTrainBackend(TrainerConfig.from_args(parse_args([*ONE_STEP, *extra])), "cpu")


def samples(seed: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(seed)
    return [TrainSample(tokens=torch.randint(3, 60, (6,), generator=g).tolist(), response_length=3,
                        loss_mask=[1, 1, 1], reward=float(torch.rand((), generator=g))) for _ in range(32)]


def weights(b: TorchTrainBackend) -> list[torch.Tensor]:
    return [p.detach().clone() for p in b.model.parameters()]


def test_sgd_steps_each_weight_by_its_momentum_buffer() -> None:
    """One optimizer step a rollout: w_{k+1} = w_k - lr * buf_{k+1} bitwise, the buffer of step 1 is the first
    (weight-decayed) gradient and later buffers carry momentum 0.5 of the last; Adam would move w otherwise."""
    b = backend(*SGD)
    assert isinstance(b.optimizer, torch.optim.SGD) and b.optimizer.param_groups[0]["momentum"] == 0.5
    before, buffers = weights(b), None
    for step in range(2):
        b.train_rollout(samples(step), step)
        params = list(b.model.parameters())
        now = [b.optimizer.state[p]["momentum_buffer"].clone() for p in params]
        for w0, buf, p in zip(before, now, params, strict=True):
            assert torch.equal(p.detach(), w0.add(buf, alpha=-0.05))
        if buffers is not None:
            assert any(not torch.equal(a, c) for a, c in zip(buffers, now, strict=True))
        before, buffers = weights(b), now
    assert isinstance(backend().optimizer, torch.optim.AdamW)  # the default


def test_the_critic_steps_with_the_same_optimizer() -> None:
    b = backend(*SGD, "--advantage-estimator", "ppo")
    assert isinstance(b.critic.optimizer, torch.optim.SGD)
    assert b.critic.optimizer.param_groups[0]["momentum"] == 0.5
    assert isinstance(backend("--advantage-estimator", "ppo").critic.optimizer, torch.optim.AdamW)


def test_a_checkpoint_resumes_sgds_momentum_bitwise(tmp_path) -> None:
    a = backend(*SGD, "--advantage-estimator", "ppo")
    a.train_rollout(samples(0), 0)
    a.save(str(tmp_path), save_optimizer=True)
    resumed = backend(*SGD, "--advantage-estimator", "ppo")
    resumed.load(str(tmp_path))
    a.train_rollout(samples(1), 1)
    resumed.train_rollout(samples(1), 1)
    assert resumed.checksums() == a.checksums()
    fresh = backend(*SGD, "--advantage-estimator", "ppo")  # without the momentum: another step
    fresh.load(str(tmp_path))
    for opt in (fresh.optimizer, fresh.critic.optimizer):
        opt.state.clear()
    fresh.train_rollout(samples(1), 1)
    assert fresh.checksums() != a.checksums()


def test_state_of_the_other_optimizer_is_refused_in_one_line(tmp_path) -> None:
    b = backend(*SGD)
    b.train_rollout(samples(0), 0)
    b.save(str(tmp_path), save_optimizer=True)
    with pytest.raises(ValueError, match=r"optimizer\.pt: optimizer state saved with --optimizer sgd, this run uses "
                                         r"--optimizer adam; resume with --optimizer sgd"):
        backend().load(str(tmp_path))
    assert saved_kind(backend().optimizer.state_dict()) == "adam"
    assert saved_kind(b.optimizer.state_dict()) == "sgd"
    check_saved_state(b.optimizer.state_dict(), b.optimizer, "x")  # its own kind passes


@pytest.mark.parametrize("flags, message", [
    (["--sgd-momentum", "0.5"], "--sgd-momentum applies to --optimizer sgd only"),
    (["--optimizer", "sgd", "--sgd-momentum", "-0.1"], "--sgd-momentum must be >= 0"),
])
def test_sgd_flags_refused_where_they_cannot_act(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*ONE_STEP, *flags])
