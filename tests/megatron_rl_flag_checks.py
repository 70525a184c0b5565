"""The RL-loop and overlap flags on a built `MegatronTrainBackend`, shared by the GPU test
(tests/gpu/test_megatron_rl_flags_gpu.py, in process) and the gloo CPU test (tests/test_megatron_rl_flags_cpu.py, in
spawned workers with tests/megatron_workers.py's shims). Each check builds its backends with ``make(*flags)`` and
observes the flag's effect on megatron's own objects:

* ``--reset-optimizer-states``: every torch optimizer inside megatron's starts each rollout afresh (Adam's step 1);
* ``--use-rollout-entropy``: the old-policy pass's per-token entropy, logged as train/rollout_entropy;
* ``--ref-update-interval``: the reference GPTModel takes the policy's weights bitwise;
* ``--keep-old-actor``: the copy holds the synced weights between syncs and computes the old log-probs;
* ``--recompute-loss-function``: the checkpointed loss runs twice per micro-batch, same loss and weights;
* ``--lr-decay-style``: the rate megatron's Adam steps with follows the schedule;
* ``--opd-type sglang``: no teacher model in the backend; the samples' teacher log-probs drive the step;
* ``--advantage-estimator ppo``: the critic steps as the torch backend's does, and a checkpoint restores it;
* ``--ref-load`` / ``--opd-teacher-ckpt-step`` of a Megatron checkpoint: the reference / teacher hold that step;
* ``--overlap-grad-reduce`` / ``--overlap-param-gather``: megatron-core DDP's overlap trains the same weights (one
  rank: the hooks, the deferred gather and its finish before the export run; the DP-2 sums are
  tests/test_megatron_backend_cpu.py's).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

from tests.gpu.samples import varied_samples

Make = Callable[..., Any]  # make(*flags) -> MegatronTrainBackend

def flags(*extra: str) -> list[str]:
    """One rank of small-qwen3: 8 samples a rollout (the global batch), micro-batches of 2, three rollouts."""
    return ["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", "small-qwen3", "--prompt-data",
            "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "3",
            "--micro-batch-size", "2", "--lr", "3e-3", *extra]


def _inner(backend) -> list[torch.optim.Optimizer]:
    from relax.backends.megatron.offload import torch_optimizers

    return list(torch_optimizers(backend.optimizer))


def _adam_steps(backend) -> set[int]:
    return {int(s["step"]) for opt in _inner(backend) for s in opt.state.values()}


def _same(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def check_reset_optimizer_states_starts_megatrons_adam_afresh_each_rollout(make: Make) -> None:
    plain, reset = make(), make("--reset-optimizer-states")
    for step in range(2):  # one optimizer step per rollout (8 samples, the global batch)
        plain.train_rollout(varied_samples(seed=step), step)
        reset.train_rollout(varied_samples(seed=step), step)
    assert _adam_steps(plain) == {2}
    assert _adam_steps(reset) == {1}  # the second rollout's step began from empty moments


def check_rollout_entropy_is_the_old_policys_over_the_loss_mask(make: Make) -> None:
    from relax.backends.torch.batch import build_rollout_tensors

    backend = make("--use-rollout-entropy")
    batch = build_rollout_tensors(varied_samples(seed=3))
    _, entropy = backend._log_probs_and_entropy_no_grad(backend.model, batch)  # the weights before the step
    mask = batch.loss_mask
    want = float((entropy * mask).sum() / mask.sum())
    assert 0 < want <= math.log(backend.spec.vocab_size)
    metrics = backend.train_rollout(varied_samples(seed=3), 0)
    assert metrics["train/rollout_entropy"] == pytest.approx(want, rel=1e-6)
    assert "train/rollout_entropy" not in make().train_rollout(varied_samples(seed=3), 0)


def check_ref_update_interval_copies_the_policy_into_the_reference(make: Make) -> None:
    kl = ("--use-kl-loss", "--kl-loss-coef", "0.05")
    updated, kept = make(*kl, "--ref-update-interval", "1"), make(*kl)
    m = updated.train_rollout(varied_samples(seed=4), 0)
    kept.train_rollout(varied_samples(seed=4), 0)
    assert m["train/ref_updated"] == 1.0
    assert _same(updated.ref_model, updated.built.module)
    assert not _same(kept.ref_model, kept.built.module)


def check_keep_old_actor_holds_the_synced_weights_between_syncs(make: Make) -> None:
    from relax.backends.torch.batch import build_rollout_tensors

    backend = make("--keep-old-actor", "--update-weights-interval", "2")
    batch = build_rollout_tensors(varied_samples(seed=6))
    initial = backend._log_probs_no_grad(backend.model, batch)
    m0 = backend.train_rollout(varied_samples(seed=5), 0)  # no sync after step 0: the copy stays
    assert m0["train/old_actor_refreshed"] == 0.0
    assert torch.equal(backend._log_probs_no_grad(backend.old_actor.model, batch), initial)
    assert not _same(backend.old_actor.model, backend.built.module)
    m1 = backend.train_rollout(varied_samples(seed=6), 1)  # a sync after step 1: the copy moves on
    assert m1["train/old_actor_refreshed"] == 1.0
    assert _same(backend.old_actor.model, backend.built.module)


def check_recomputed_loss_function_gives_the_same_step(make: Make) -> None:
    plain, recomputed = make(), make("--recompute-loss-function")
    mp = plain.train_rollout(varied_samples(seed=7), 0)
    mr = recomputed.train_rollout(varied_samples(seed=7), 0)
    for key in ("train/loss", "train/pg_loss", "train/grad_norm"):
        assert mr[key] == pytest.approx(mp[key], rel=1e-6, abs=1e-9), key
    before, after = plain.hf_state(), recomputed.hf_state()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert plain.loss_function_runs == 0
    assert recomputed.loss_function_runs == 2 * 4  # 4 micro-batches of 2: once forward, once in the backward


def check_lr_decay_sets_the_rate_megatrons_adam_steps_with(make: Make) -> None:
    from relax.backends.lr_schedule import LRSchedule

    backend = make("--lr-decay-style", "cosine")
    schedule = LRSchedule.of(backend.cfg)
    rates = []
    for step in range(3):
        metrics = backend.train_rollout(varied_samples(seed=step), step)
        want = schedule.lr_at(step, 0)
        assert metrics["train/lr"] == pytest.approx(want, rel=1e-12)
        assert {g["lr"] for opt in _inner(backend) for g in opt.param_groups} == {want}
        rates.append(want)
    assert rates[0] == pytest.approx(3e-3) and rates[0] > rates[1] > rates[2] > 0


def check_overlapped_grad_reduce_and_param_gather_train_the_same_weights(make: Make) -> None:
    dist = ("--use-distributed-optimizer", "--global-batch-size", "4")  # two optimizer steps per rollout
    plain, overlapped = make(*dist), make(*dist, "--overlap-grad-reduce", "--overlap-param-gather")
    for step in range(2):
        mp = plain.train_rollout(varied_samples(seed=step), step)
        mo = overlapped.train_rollout(varied_samples(seed=step), step)
        assert mo["train/num_optimizer_steps"] == mp["train/num_optimizer_steps"] == 2.0
        assert mo["train/loss"] == pytest.approx(mp["train/loss"], rel=1e-6, abs=1e-9)
        assert mo["train/grad_norm"] == pytest.approx(mp["train/grad_norm"], rel=1e-6)
        assert overlapped.checksums() == plain.checksums()


def check_opd_with_an_sglang_teacher_uses_the_samples_teacher_log_probs(make: Make) -> None:
    from relax.backends.torch.batch import build_rollout_tensors

    backend = make("--use-opd", "--opd-type", "sglang", "--rm-url", "http://127.0.0.1:9/generate")
    assert backend.teacher is None
    samples = varied_samples(seed=8)
    for i, s in enumerate(samples):
        s.teacher_log_probs = [-0.5 - 0.1 * i] * s.response_length
    batch = build_rollout_tensors(samples)
    old = backend._log_probs_no_grad(backend.model, batch)
    metrics = backend.train_rollout(samples, 0)
    mask = batch.loss_mask
    want = float(((old - batch.teacher_log_probs) * mask).sum() / mask.sum())
    assert metrics["train/opd_reverse_kl"] == pytest.approx(want, rel=1e-6)


def _torch_twin(backend, *extra: str):
    """The torch backend on the Megatron backend's device, from the same flags."""
    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.utils.arguments import parse_args

    argv = flags(*extra)
    argv[argv.index("--train-backend") + 1] = "torch"
    argv[argv.index("--device") + 1] = backend.device.type
    return TorchTrainBackend(TrainerConfig.from_args(parse_args(argv)), backend.device.type)


def check_ppo_critic_steps_as_the_torch_backends_and_resumes(make: Make) -> None:
    """--advantage-estimator ppo: the Megatron backend's critic is relax's torch value model fed by the inherited
    step. Without a KL term in the reward the returns depend on the rewards and the critic's values alone, so two
    rollouts leave it bitwise equal to the torch backend's critic on the same samples; a checkpoint restores it
    and its optimizer state."""
    import tempfile

    ppo = ("--advantage-estimator", "ppo")
    megatron = make(*ppo)
    torch_backend = _torch_twin(megatron, *ppo)
    for step in range(2):
        got = megatron.train_rollout(varied_samples(seed=20 + step), step)
        want = torch_backend.train_rollout(varied_samples(seed=20 + step), step)
        for key in ("train/value_loss", "train/critic_grad_norm"):
            assert got[key] == want[key], (step, key, got[key], want[key])
    assert _same(megatron.critic.model, torch_backend.critic.model)
    with tempfile.TemporaryDirectory() as tmp:
        megatron.save(tmp, save_optimizer=True)
        resumed = make(*ppo)
        assert not _same(resumed.critic.model, megatron.critic.model)  # a fresh critic: its head starts at zero
        resumed.load(tmp)
    assert _same(resumed.critic.model, megatron.critic.model)
    steps = {int(s["step"]) for s in resumed.critic.optimizer.state.values()}
    assert steps == {int(s["step"]) for s in megatron.critic.optimizer.state.values()} == {2}


def check_reference_and_teacher_load_a_saved_megatron_step(make: Make) -> None:
    """--ref-load / --opd-teacher-load of a ``relax train --save`` directory (a Megatron checkpoint): the reference
    and the OPD teacher hold that step's weights, not the --hf-checkpoint's the policy starts from."""
    import tempfile

    from relax import checkpoint as ckpt

    policy = make()
    policy.train_rollout(varied_samples(seed=30), 0)  # the saved weights differ from the initial ones
    with tempfile.TemporaryDirectory() as root:
        partial = ckpt.begin(root, 0)
        policy.save(str(partial), save_optimizer=False)
        ckpt.publish(root, 0)
        with_ref = make("--use-kl-loss", "--ref-load", root)
        with_teacher = make("--use-opd", "--opd-type", "megatron", "--opd-teacher-load", root,
                            "--opd-teacher-ckpt-step", "0")
    saved = policy._policy_module()
    assert _same(with_ref.ref_model, saved) and not _same(with_ref._policy_module(), saved)
    assert _same(with_teacher.teacher, saved)


CHECKS: list[str] = [name for name in dict(globals()) if name.startswith("check_")]  # in the order above
