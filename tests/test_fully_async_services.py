"""The fully-async services (``reference``, ``actor_fwd``, ``advantages`` roles, ``--ref-actor-config``).

- the flag rules, as a table;
- in process (no Ray): the services' columns fed to a trainer without a reference model give
  bitwise the trainer's own step, with ``--num-iters-per-train-update`` 1 and 2;
- end to end on Ray (marker ``ray``): ``--fully-async --max-staleness 0`` with KL loss, with and
  without the roles, equal step for step, and actor_fwd's checksums equal the trainer's at every version.
"""

from __future__ import annotations

import json
from argparse import Namespace
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.services import AdvantageService, ForwardService
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import Precomputed, build_rollout_tensors
from relax.utils.flag_types import ConfigError
from relax.utils.validation import _services
from relax.weights.checksum import state_checksums
from tests.metric_helpers import no_timings
from tests.test_train_loop_flags import _args, _samples

torch.set_num_threads(1)  # the CI machine has 2 cores shared by two test workers

ALL_ROLES = '{"actor":[1,0],"rollout":[1,0],"reference":[1,0],"actor_fwd":[1,0],"advantages":[1,0]}'
FORWARD_ROLES = '{"reference":[1,0],"actor_fwd":[1,0]}'
KL_LOSS = ("--use-kl-loss", "--kl-loss-coef", "0.05")
SEED_004 = ('{"tensor_model_parallel_size": 1, "max_tokens_per_gpu": 16384, "sequence_parallel": false, '
            '"only_load_weight": true}')


def _service_args(*flags: str, resource: str = ALL_ROLES) -> Namespace:
    return _args("--fully-async", "--resource", resource, *flags)


# ---------------------------------------------------------------------- flag rules
def test_roles_parse_and_resolve_the_config() -> None:
    args = _service_args(*KL_LOSS)
    assert args.ref_actor_config == {"tensor_model_parallel_size": 1, "sequence_parallel": False,
                                     "max_tokens_per_gpu": None, "only_load_weight": True}
    assert _service_args(*KL_LOSS, "--ref-actor-config", SEED_004).ref_actor_config["max_tokens_per_gpu"] == 16384
    assert _service_args(resource='{"actor_fwd":[1,0]}').ref_actor_config["only_load_weight"] is True
    assert _args().ref_actor_config is None  # no roles: nothing to configure


@pytest.mark.parametrize(("flags", "message"), [
    (["--resource", ALL_ROLES, *KL_LOSS], r"--resource roles actor_fwd, advantages, reference need --fully-async"),
    (["--fully-async", "--resource", ALL_ROLES], r"role 'reference' needs a reference model \(--use-kl-loss"),
    (["--fully-async", "--resource", '{"advantages":[1,0],"actor_fwd":[1,0]}', "--advantage-estimator", "ppo"],
     r"not supported yet: --resource role 'advantages' with --advantage-estimator ppo"),
    (["--fully-async", "--resource", '{"advantages":[1,0]}'], r"role 'advantages' needs 'actor_fwd'"),
    (["--fully-async", "--resource", '{"advantages":[1,0],"actor_fwd":[1,0]}', *KL_LOSS],
     r"role 'advantages' needs 'reference' with a KL term"),
    (["--fully-async", "--resource", '{"advantages":[1,1],"actor_fwd":[1,1]}'],
     r"role 'advantages' computes on CPU; give it 0 GPUs"),
    (["--fully-async", "--resource", '{"critic":[1,0]}'], r"--resource: unknown role 'critic'; known: actor, rollout, "),
    (["--fully-async", "--ref-actor-config", SEED_004],
     r"^--ref-actor-config needs a reference or actor_fwd role in --resource$"),
    (["--fully-async", "--resource", '{"advantages":[1,0],"actor_fwd":[1,0]}', "--ref-actor-config", "{}"], None),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", '{"tensor_model_parallel_size": 2}'],
     r"^not supported yet: --ref-actor-config tensor_model_parallel_size=2$"),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", '{"sequence_parallel": true}'],
     r"^not supported yet: --ref-actor-config sequence_parallel=true$"),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", '{"only_load_weight": false}'],
     r"^not supported yet: --ref-actor-config only_load_weight=false"),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", '{"micro_batch": 4}'],
     r"^--ref-actor-config: unknown key 'micro_batch'; known: tensor_model_parallel_size, "),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", '{"max_tokens_per_gpu": 0}'],
     r"^--ref-actor-config: max_tokens_per_gpu must be an integer >= 1 or null, got 0$"),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", '{"sequence_parallel": "no"}'],
     r"^--ref-actor-config: sequence_parallel must be true or false, got 'no'$"),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", "[1]"],
     r"^--ref-actor-config must be a JSON object like"),
    (["--fully-async", "--resource", FORWARD_ROLES, *KL_LOSS, "--ref-actor-config", "{tp: 1"],
     r"--ref-actor-config: invalid JSON"),
])
def test_flag_rules(flags: list[str], message: str | None) -> None:
    if message is None:
        _args(*flags)
        return
    with pytest.raises(ConfigError, match=message):
        _args(*flags)


def test_megatron_services_pass_the_rule_and_run_on_a_world_of_one() -> None:
    """Parsed on CPU as torch (megatron needs a GPU to parse), then the rule itself; the services' copy of the
    Megatron slice has no parallelism (their runs: tests/megatron_rl_flag_checks.py, megatron marker)."""
    from relax.backends.services import service_config

    args = _service_args(*KL_LOSS)
    args.train_backend, args.tensor_model_parallel_size, args.sequence_parallel = "megatron", 2, True
    args.resource = {"actor": [1, 1], "reference": [1, 1], "actor_fwd": [2, 1]}  # as a GPU run parses it
    _services(args)
    args.resource = {"reference": [1, 0], "actor_fwd": [1, 1], "advantages": [1, 0]}  # advantages computes on CPU
    with pytest.raises(ConfigError, match=r"^--resource role 'reference' with --train-backend megatron needs 1 GPU a "
                                          r"replica, got 0 \(its copy of the Megatron model runs on a GPU"):
        _services(args)
    cfg = service_config(TrainerConfig.from_args(args))
    assert (cfg.megatron.tensor_model_parallel_size, cfg.megatron.sequence_parallel) == (1, False)


# ---------------------------------------------------------------------- in process, no Ray
class _Stored:
    """Stands in for the data queue's StoredBatch: services fetch the samples themselves."""

    def __init__(self, samples: list) -> None:
        self.samples = samples

    def fetch(self) -> list:
        return self.samples


def _sync(source: TorchTrainBackend, target: ForwardService) -> None:
    for bucket in source.weight_buckets(4096):
        target.update_weights_from_tensors(bucket, version=None)


def _sums(service: ForwardService) -> dict[str, str]:
    """What the service's /weights_checker checksum answers (relax/backends/embedded/weight_routes.py)."""
    return state_checksums(service.model.state_dict().items())


@pytest.mark.parametrize("roles", ["all", "forward"])
@pytest.mark.parametrize("iters", ["1", "2"])
@pytest.mark.parametrize("kl", [KL_LOSS, ("--kl-coef", "0.1")], ids=["kl-loss", "kl-reward"])
def test_service_columns_give_the_trainers_own_step(roles: str, iters: str, kl: tuple[str, ...]) -> None:
    flags = (*kl, "--lr", "0.02", "--num-iters-per-train-update", iters)
    alone = TorchTrainBackend(TrainerConfig.from_args(_args(*flags)), "cpu")  # computes every column itself
    args = _service_args(*flags, resource=ALL_ROLES if roles == "all" else FORWARD_ROLES)
    trainer = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    assert trainer.ref_model is None and alone.ref_model is not None  # the reference lives in the service
    reference, actor_fwd = ForwardService(TrainerConfig.from_args(args), "cpu", "reference"), ForwardService(TrainerConfig.from_args(args), "cpu", "actor_fwd")
    advantages = AdvantageService(TrainerConfig.from_args(args))
    _sync(trainer, actor_fwd)
    for step in range(2):
        samples = _samples(seed=10 + step)
        stored = _Stored(samples)
        old, ref = actor_fwd.log_probs(stored), reference.log_probs(stored)
        batch = build_rollout_tensors(samples)
        assert torch.equal(old, alone._log_probs_no_grad(alone.model, batch))
        assert torch.equal(ref, alone._log_probs_no_grad(alone.ref_model, batch))
        pre = advantages.compute(stored, old, ref) if roles == "all" else Precomputed(old, ref)
        assert no_timings(alone.train_rollout(samples, step)) == no_timings(trainer.train_rollout(samples, step, pre))
        for (name, p), q in zip(alone.model.named_parameters(), trainer.model.parameters(), strict=True):
            assert torch.equal(p, q), (step, name)
        _sync(trainer, actor_fwd)
        assert _sums(actor_fwd) == trainer.checksums()
    assert _sums(reference) == state_checksums(alone.ref_model.state_dict().items())


@pytest.mark.parametrize("replicas", [2, 3, 7])
def test_replica_parts_add_up_to_the_whole_batch_bitwise(replicas: int) -> None:
    """Replica i of k computes micro-batches i, i + k, ... of the trainer's split and zeros elsewhere: the parts
    add up (relax/core/services.py) to exactly what one replica computes, whatever k (7: more replicas than
    the batch's 4 micro-batches leaves some idle)."""
    args = _service_args(*KL_LOSS, resource=FORWARD_ROLES)
    service = ForwardService(TrainerConfig.from_args(args), "cpu", "reference")
    samples = _samples(seed=11)
    whole = service.log_probs(_Stored(samples))
    parts = [service.log_probs(_Stored(samples), (i, replicas)) for i in range(replicas)]
    assert len(service.backend._all_micro_batches(samples, log_probs=True)) == 4
    assert all(p.shape == whole.shape for p in parts) and sum(bool(p.any()) for p in parts) == min(replicas, 4)
    assert torch.equal(sum(parts[1:], parts[0]), whole)


def test_service_token_budget_changes_only_the_split() -> None:
    args = _service_args(*KL_LOSS, "--ref-actor-config", '{"max_tokens_per_gpu": 24}', resource=FORWARD_ROLES)
    trainer = TorchTrainBackend(TrainerConfig.from_args(_args(*KL_LOSS)), "cpu")
    service = ForwardService(TrainerConfig.from_args(args), "cpu", "reference")
    samples = _samples(seed=10)
    assert service.backend._all_micro_batches(samples, log_probs=True) != trainer._all_micro_batches(samples)
    expected = trainer._log_probs_no_grad(trainer.ref_model, build_rollout_tensors(samples))
    assert float((service.log_probs(samples) - expected).abs().max()) < 1e-6
    assert service.backend.optimizer is None
    assert not any(p.requires_grad for p in service.backend.model.parameters())


def test_reference_service_refuses_weight_updates() -> None:
    service = ForwardService(TrainerConfig.from_args(_service_args(*KL_LOSS, resource=FORWARD_ROLES)), "cpu", "reference")
    with pytest.raises(RuntimeError, match="frozen"):
        service.update_weights_from_tensors([], version=1)


def test_reference_service_holds_ref_load(tmp_path: Path) -> None:
    """--ref-load of a relax checkpoint with a reference service: with --load the service holds the checkpoint's
    weights (the trainer resumes the policy); without, the policy starts from it too (seed 000) and so does the
    service's reference."""
    from safetensors.torch import load_file

    from relax import checkpoint as ckpt

    saver = TorchTrainBackend(TrainerConfig.from_args(_args()), "cpu")
    saver.train_rollout(_samples(seed=12), 0)
    root = tmp_path / "save"
    partial = ckpt.begin(root, 0)
    saver.save(str(partial), save_optimizer=False)
    ckpt.write_driver_state(partial, ckpt.DriverState(next_step=1, weight_version=1, data_source={}))
    ckpt.publish(root, 0)
    saved = load_file(str(ckpt.iteration_dir(root, 0) / "model.safetensors"))
    initial = TorchTrainBackend(TrainerConfig.from_args(_args()), "cpu").model.state_dict()
    assert any(not torch.equal(initial[k], v) for k, v in saved.items())  # the step moved the weights
    for load in ([], ["--load", str(root)]):
        cfg = TrainerConfig.from_args(_service_args(*KL_LOSS, "--ref-load", str(root), *load, resource=FORWARD_ROLES))
        reference, trainer = ForwardService(cfg, "cpu", "reference"), TorchTrainBackend(cfg, "cpu")
        assert trainer.ref_model is None  # the reference lives in the service
        assert all(torch.equal(reference.model.state_dict()[k], v) for k, v in saved.items())
        policy = trainer.model.state_dict()
        assert all(torch.equal(policy[k], (initial if load else saved)[k]) for k in saved)


def test_actor_fwd_sync_writes_every_tensor() -> None:
    """--check-weight-update-equal randomizes actor_fwd like an engine; one sync restores every tensor."""
    args = _service_args(resource='{"actor_fwd":[1,0]}')
    trainer, actor_fwd = TorchTrainBackend(TrainerConfig.from_args(args), "cpu"), ForwardService(TrainerConfig.from_args(args), "cpu", "actor_fwd")
    trainer.train_rollout(_samples(seed=10), 0)
    actor_fwd.checker().run("reset_tensors")
    noisy, target = _sums(actor_fwd), trainer.checksums()
    assert all(noisy[name] != target[name] for name in target)
    _sync(trainer, actor_fwd)
    assert _sums(actor_fwd) == target


def test_harness_weight_check_judges_actor_fwd_sides(tmp_path: Path) -> None:
    from harness.artifacts import RunArtifacts
    from harness.checks import CheckContext, Status, parse_check
    from harness.synthetic import edit_jsonl, make_run

    run = make_run(tmp_path / "run", engines=1)

    def add_actor_fwd(records: list[dict]) -> list[dict]:
        extra = [{**r, "side": "actor_fwd:0", "checksums": dict(r["checksums"])} for r in records if r["side"] == "trainer"]
        return records + extra

    edit_jsonl(run / "weights.jsonl", add_actor_fwd)

    def judge():
        context = CheckContext(runs={"main": RunArtifacts.load(run)}, root=tmp_path,
                               baselines_dir=tmp_path / "baselines", baseline_key="synthetic")
        return parse_check({"kind": "weight_equality", "engines": 1}).run_check(context)

    passed = judge()
    assert passed.status is Status.PASSED, passed.message
    assert passed.details["engine_sides"] == ["engine:0"]

    def corrupt(records: list[dict]) -> list[dict]:
        for r in records:
            if r["side"] == "actor_fwd:0" and r["version"] == 2:
                r["checksums"]["lm_head.weight"] = "deadbeef0000"
        return records

    edit_jsonl(run / "weights.jsonl", corrupt)
    failed = judge()
    assert failed.status is Status.FAILED and "version 2: actor_fwd:0 tensor 'lm_head.weight'" in failed.message


# ---------------------------------------------------------------------- end to end (Ray)
# --rollout-seed 1: step 0's rollout (the same in every variant) holds a rewarded sample, so the runs compare
# real policy-gradient steps (the "vacuous" guard below), whatever the later steps draw
E2E_FLAGS = ["--rollout-batch-size", "16", "--num-rollout", "3", "--fully-async", "--max-staleness", "0",
             "--use-kl-loss", "--kl-loss-coef", "0.01", "--rollout-seed", "1"]
E2E_KEYS = ("train/loss", "train/pg_loss", "train/kl_loss", "train/ppo_kl", "train/pg_clipfrac", "train/grad_norm",
            "train/entropy", "train/advantages_mean", "train/num_optimizer_steps", "rollout/reward_mean")


def _e2e(tmp_path: Path, name: str, *flags: str) -> Path:
    from tests.e2e_helpers import FAST_FLAGS, assert_ok, run_relax

    proc = run_relax([*FAST_FLAGS, *E2E_FLAGS, *flags, "--output-dir", str(tmp_path / name)], tmp_path)
    assert_ok(proc)
    return tmp_path / name


TWO_EACH = '{"actor":[1,0],"rollout":[1,0],"reference":[2,0],"actor_fwd":[2,0],"advantages":[2,0]}'


@pytest.mark.ray
@pytest.mark.parametrize(("iters", "config", "replicas"), [("1", None, 2), ("2", SEED_004, 1)],
                         ids=["iters1-two-replicas", "iters2-seed004-config"])
def test_services_equal_the_trainer_alone(tmp_path: Path, iters: str, config: str | None, replicas: int) -> None:
    """Without --ref-actor-config the services split micro-batches like the trainer: bitwise equal runs, also
    with two replicas of each role (each computes every other micro-batch of the trainer's split; the
    advantages replicas take whole batches in turn). Seed 004's config packs them by its token budget
    instead: equal to float summation order."""
    from tests.e2e_helpers import read_jsonl

    alone = _e2e(tmp_path, "alone", "--num-iters-per-train-update", iters)
    served = _e2e(tmp_path, "served", "--num-iters-per-train-update", iters, "--resource",
                  TWO_EACH if replicas == 2 else ALL_ROLES, *(["--ref-actor-config", config] if config else []))
    ma, mb = read_jsonl(alone / "metrics.jsonl"), read_jsonl(served / "metrics.jsonl")
    assert [m["step"] for m in mb] == [0, 1, 2]
    for a, b in zip(ma, mb, strict=True):
        for key in E2E_KEYS:
            if config is None:
                assert a[key] == b[key], f"step {a['step']} {key}: alone {a[key]} vs services {b[key]}"
            assert abs(a[key] - b[key]) < 1e-6, f"step {a['step']} {key}: alone {a[key]} vs services {b[key]}"
        assert b["train/num_optimizer_steps"] == 2 * int(iters)
    assert any(m["rollout/reward_mean"] > 0 for m in mb) and any(m["train/kl_loss"] != 0 for m in mb), "vacuous"
    weights = read_jsonl(served / "weights.jsonl")
    versions = sorted({r["version"] for r in weights})
    assert versions == [0, 1, 2, 3]
    fwd = [f"actor_fwd:{i}" for i in range(replicas)]
    for version in versions:
        sides = {r["side"]: r["checksums"] for r in weights if r["version"] == version}
        assert sides.keys() == {"trainer", "engine:0", *fwd}
        assert all(sides[side] == sides["trainer"] == sides["engine:0"] for side in fwd), version
    if config is None:
        alone_sums = {r["version"]: r["checksums"] for r in read_jsonl(alone / "weights.jsonl") if r["side"] == "trainer"}
        assert all(alone_sums[r["version"]] == r["checksums"] for r in weights if r["side"] == "trainer")
    roles = {e.get("role") for e in read_jsonl(served / "events.jsonl") if e["event"] == "process_started"}
    assert {f"{role}:{i}" for role in ("reference", "actor_fwd", "advantages") for i in range(replicas)} <= roles
    resolved = json.loads((served / "run.json").read_text())["config"]["ref_actor_config"]
    assert resolved["max_tokens_per_gpu"] == (16384 if config else None)
