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
* ``--attention-backend unfused`` / ``local``: megatron-core's own DotProductAttention in every layer, the log-probs
  of relax's SDPA core attention within bf16 rounding;
* ``--optimizer sgd``: megatron's fp32 main params step by torch SGD's momentum buffers, which a checkpoint restores;
* ``--opd-type sglang``: no teacher model in the backend; the samples' teacher log-probs drive the step;
* ``--advantage-estimator ppo``: the critic steps as the torch backend's does, and a checkpoint restores it;
* ``--ref-load`` / ``--opd-teacher-ckpt-step`` of a Megatron checkpoint: the reference / teacher hold that step;
  without ``--load`` the policy starts from ``--ref-load``;
* the fully-async ``reference`` / ``actor_fwd`` services' Megatron copies: the trainer's columns bitwise, syncs;
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


def check_attention_backend_unfused_builds_megatrons_own_core_attention(make: Make) -> None:
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    from relax.backends.megatron.attention import SdpaCoreAttention
    from relax.backends.torch.batch import build_rollout_tensors

    def cores(backend) -> set[type]:
        return {type(m.core_attention) for m in backend.model.modules() if hasattr(m, "core_attention")}

    batch = build_rollout_tensors(varied_samples(seed=60))
    lps = {}
    for value in ("auto", "unfused", "local"):
        backend = make("--attention-backend", value)
        assert cores(backend) == ({SdpaCoreAttention} if value == "auto" else {DotProductAttention}), value
        lps[value] = backend._log_probs_no_grad(backend.model, batch)
    assert torch.equal(lps["unfused"], lps["local"])
    mask = batch.loss_mask.bool()
    assert (lps["unfused"] - lps["auto"])[mask].abs().max() < 0.02  # bf16: the module docstring's floor ~0.006


def check_sgd_steps_megatrons_main_params_and_resumes_its_momentum(make: Make) -> None:
    """--optimizer sgd (megatron-core's OptimizerConfig): every torch optimizer inside megatron's is SGD with
    --sgd-momentum, each fp32 main param moves by -lr times its momentum buffer, the buffers carry over from step
    to step, and a checkpoint (which megatron-core 0.19.2 cannot write for SGD by itself: relax's
    ``_init_sgd_state``) resumes them: the next step's weights are bitwise the uninterrupted run's. Adam's
    checkpoint is refused by an SGD run in one line."""
    import tempfile

    sgd = ("--optimizer", "sgd", "--sgd-momentum", "0.5")
    backend = make(*sgd)
    inner = _inner(backend)
    assert inner and all(type(o) is torch.optim.SGD and o.param_groups[0]["momentum"] == 0.5 for o in inner)
    params = [p for o in inner for g in o.param_groups for p in g["params"]]
    before, buffers = [p.detach().clone() for p in params], None
    for step in range(2):  # one optimizer step per rollout
        backend.train_rollout(varied_samples(seed=50 + step), step)
        now = [o.state[p]["momentum_buffer"].clone() for o in inner for g in o.param_groups for p in g["params"]]
        lr = inner[0].param_groups[0]["lr"]
        assert all(torch.equal(p.detach(), w0.add(buf, alpha=-lr)) for p, w0, buf in zip(params, before, now,
                                                                                          strict=True))
        assert buffers is None or any(not torch.equal(a, b) for a, b in zip(buffers, now, strict=True))
        before, buffers = [p.detach().clone() for p in params], now
    with tempfile.TemporaryDirectory() as tmp:
        backend.save(tmp, save_optimizer=True)
        resumed = make(*sgd)
        resumed.load(tmp)
        with pytest.raises(ValueError, match="saved with --optimizer sgd, this run uses --optimizer adam"):
            make().load(tmp)
    backend.train_rollout(varied_samples(seed=52), 2)
    resumed.train_rollout(varied_samples(seed=52), 2)
    assert resumed.checksums() == backend.checksums()


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


def check_ref_load_and_teacher_load_a_saved_megatron_step(make: Make) -> None:
    """--ref-load / --opd-teacher-load of a ``relax train --save`` directory (a Megatron checkpoint). Seed 000: without
    --load the policy starts from --ref-load (the reference is that initial policy); with --load (the driver resumes
    it later) the reference holds --ref-load's step and the policy the --hf-checkpoint's weights until then. The
    OPD teacher holds its step."""
    import tempfile

    from relax import checkpoint as ckpt

    policy, initial = make(), make()
    policy.train_rollout(varied_samples(seed=30), 0)  # the saved weights differ from the initial ones
    with tempfile.TemporaryDirectory() as root:
        partial = ckpt.begin(root, 0)
        policy.save(str(partial), save_optimizer=False)
        ckpt.write_driver_state(partial, ckpt.DriverState(next_step=1, weight_version=1, data_source={}))  # --load's
        ckpt.publish(root, 0)
        started = make("--use-kl-loss", "--ref-load", root)
        resumed = make("--use-kl-loss", "--ref-load", root, "--load", root)
        with_teacher = make("--use-opd", "--opd-type", "megatron", "--opd-teacher-load", root,
                            "--opd-teacher-ckpt-step", "0")
    saved = policy._policy_module()
    assert _same(started._policy_module(), saved) and _same(started.ref_model, saved)
    assert _same(resumed.ref_model, saved) and _same(resumed._policy_module(), initial._policy_module())
    assert not _same(saved, initial._policy_module())
    assert _same(with_teacher.teacher, saved)


def check_fully_async_services_compute_the_trainers_columns(make: Make) -> None:
    """The reference and actor_fwd services' Megatron copies (world of one): their log-probs are the trainer's own
    bitwise, so the trainer's step with their columns is its step alone; a sync's HF buckets land in the fused
    parameters (checksums equal the trainer's, also after /weights_checker's reset); a sync missing one piece of
    a fused parameter is refused at the next forward."""
    from relax.backends.services import ForwardService
    from relax.backends.torch.batch import Precomputed, build_rollout_tensors
    from relax.distributed.resources import parse_ref_actor_config
    from relax.weights.checksum import state_checksums
    from tests.metric_helpers import no_timings

    kl = ("--use-kl-loss", "--kl-loss-coef", "0.05")
    alone, trainer = make(*kl), make(*kl)
    cfg = trainer.cfg.replace(ref_actor_config=parse_ref_actor_config(None))
    device = trainer.device.type
    reference, actor_fwd = ForwardService(cfg, device, "reference"), ForwardService(cfg, device, "actor_fwd")
    assert actor_fwd.backend.optimizer is None and not any(p.requires_grad for p in actor_fwd.model.parameters())

    def sync() -> None:
        for bucket in trainer.weight_buckets(1 << 16):  # several buckets
            actor_fwd.update_weights_from_tensors(bucket, version=None)

    def sums() -> dict[str, str]:
        return state_checksums(actor_fwd.backend.checkpoint_tensors().items())

    for step in range(2):
        samples = varied_samples(seed=40 + step)
        batch = build_rollout_tensors(samples)
        sync()
        assert sums() == trainer.checksums()
        old, ref = actor_fwd.log_probs(samples), reference.log_probs(samples)
        assert torch.equal(old, alone._log_probs_no_grad(alone.model, batch))
        assert torch.equal(ref, alone._log_probs_no_grad(alone.ref_model, batch))
        halves = [actor_fwd.log_probs(samples, (i, 2)) for i in range(2)]
        assert torch.equal(halves[0] + halves[1], old)
        mine, theirs = alone.train_rollout(samples, step), trainer.train_rollout(samples, step, Precomputed(old, ref))
        assert no_timings(mine) == no_timings(theirs)
        assert _same(alone._policy_module(), trainer._policy_module())
    checker = actor_fwd.checker()
    checker.run("reset_tensors")
    noisy, target = sums(), trainer.checksums()
    assert all(noisy[name] != target[name] for name in target)
    sync()
    assert sums() == target
    named = [pair for bucket in trainer.weight_buckets(1 << 30) for pair in bucket]
    actor_fwd.update_weights_from_tensors([(n, t) for n, t in named if n != "model.layers.0.self_attn.k_proj.weight"])
    with pytest.raises(RuntimeError, match=r"left 1 tensors unsent \(model.layers.0.self_attn.k_proj.weight\)"):
        actor_fwd.log_probs(varied_samples(seed=42))


CHECKS: list[str] = [name for name in dict(globals()) if name.startswith("check_")]  # in the order above
