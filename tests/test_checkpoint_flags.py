"""The checkpoint flags observed by their effect: --max-actor-ckpt-to-keep, --async-save, --rotate-ckpt,
--start-rollout-id, --critic-save / --critic-load (relax/checkpoint.py, relax/checkpoint_io.py, relax/core/saver.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from relax import checkpoint as ckpt
from relax.checkpoint_io import BackgroundWrite, HostFile, to_host
from relax.utils.arguments import ConfigError, parse_args
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

QUICK = ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
         "--global-batch-size", "16", "--micro-batch-size", "16", "--num-rollout", "4"]


def _steps_on_disk(root: Path) -> list[int]:
    return ckpt.saved_steps(root)


def _fake_saves(root: Path, steps) -> None:
    for step in steps:
        ckpt.iteration_dir(root, step).mkdir(parents=True)
        ckpt.mark_latest(root, step)


# ------------------------------------------------------------------ pruning and the slice's rules
def test_keep_n_leaves_the_newest_n(tmp_path: Path) -> None:
    _fake_saves(tmp_path, range(5))
    assert ckpt.prune(tmp_path, keep=2) == [0, 1, 2]
    assert _steps_on_disk(tmp_path) == [3, 4]
    assert ckpt.prune(tmp_path, keep=None) == []  # no flag: nothing removed


def test_rotation_keeps_the_newest_and_the_interval_checkpoints(tmp_path: Path) -> None:
    _fake_saves(tmp_path, range(7))  # interval 2: steps 1, 3, 5 are the --save-interval checkpoints
    ckpt.prune(tmp_path, keep=None, rotate_interval=2)
    assert _steps_on_disk(tmp_path) == [1, 3, 5, 6]
    ckpt.prune(tmp_path, keep=1, rotate_interval=2)
    assert _steps_on_disk(tmp_path) == [5, 6]


@pytest.mark.parametrize("flags, line", [
    (["--rotate-ckpt"], "--rotate-ckpt requires --save, --save-interval, --async-save"),
    (["--rotate-ckpt", "--save", "c", "--save-interval", "2"], "--rotate-ckpt requires --async-save"),
    (["--critic-save", "c", "--save", "s"], "--critic-save: only with --advantage-estimator ppo"),
    (["--advantage-estimator", "ppo", "--critic-load", "c"], "--critic-load requires --load"),
    (["--start-rollout-id", "4"], "--start-rollout-id 4 must be below --num-rollout 4"),
    (["--max-actor-ckpt-to-keep", "0"], "--max-actor-ckpt-to-keep"),
])
def test_missing_requirements_are_refused_in_one_line(flags: list[str], line: str) -> None:
    with pytest.raises(ConfigError) as err:
        parse_args([*QUICK, *flags])
    assert line in str(err.value)


def test_async_save_with_megatron_is_accepted() -> None:
    """Megatron's --async-save (megatron-core's async save) is built: tests/test_megatron_async_save.py on CPU,
    tests/gpu/test_megatron_gpu.py on the GPU."""
    args = parse_args([*QUICK, "--async-save", "--save", "c"])
    args.train_backend = "megatron"
    assert ckpt.CheckpointConfig.from_args(args).async_save


def test_ckpt_step_picks_a_saved_step_or_names_the_ones_there(tmp_path: Path) -> None:
    _fake_saves(tmp_path, [1, 3])
    (ckpt.iteration_dir(tmp_path, 1) / "model.safetensors").write_bytes(b"")
    assert ckpt.find_step(tmp_path, 1, flag="--ref-ckpt-step") == ckpt.iteration_dir(tmp_path, 1)
    with pytest.raises(ckpt.CheckpointError, match=r"--ref-ckpt-step 2: no checkpoint of step 2 in .* \(saved "
                                                   r"steps: 1, 3\)"):
        ckpt.find_step(tmp_path, 2, flag="--ref-ckpt-step")


# ------------------------------------------------------------------ the background writer
def test_the_host_snapshot_shares_nothing_with_the_live_state() -> None:
    live = {"w": torch.ones(3), "state": {0: {"exp_avg": torch.zeros(2)}}}
    snap = to_host(live)
    live["w"].add_(1)
    live["state"][0]["exp_avg"].add_(1)
    assert torch.equal(snap["w"], torch.ones(3)) and torch.equal(snap["state"][0]["exp_avg"], torch.zeros(2))


def test_a_failed_background_write_names_the_file(tmp_path: Path) -> None:
    blocked = tmp_path / "model.safetensors"
    blocked.mkdir()  # a directory where the file goes: the write fails
    write = BackgroundWrite([HostFile(tmp_path / "rng.pt", "torch", {"a": 1}),
                             HostFile(blocked, "safetensors", {"w": torch.ones(2)})])
    status = write.join()
    assert status.startswith(f"writing {blocked}: ") and "\n" not in status
    assert (tmp_path / "rng.pt").exists()


# ------------------------------------------------------------------ the critic's own directory
def test_the_critic_is_saved_to_and_restored_from_its_own_directory(tmp_path: Path) -> None:
    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.backends.torch.batch import TrainSample

    args = parse_args([*QUICK, "--advantage-estimator", "ppo"])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    samples = [TrainSample(tokens=[5, 6, 7, 8], response_length=2, loss_mask=[1, 1], reward=float(i % 2))
               for i in range(32)]
    backend.train_rollout(samples, 0)  # the critic and its optimizer state move off their initial values
    actor_dir, critic_dir = tmp_path / "actor", tmp_path / "critic"
    backend.save(str(actor_dir), save_optimizer=True, critic_directory=str(critic_dir))
    assert sorted(p.name for p in critic_dir.iterdir()) == ["critic.safetensors", "critic_optimizer.pt"]
    assert not (actor_dir / "critic.safetensors").exists() and (actor_dir / "model.safetensors").exists()
    saved = {k: v.clone() for k, v in backend.critic.model.state_dict().items()}
    saved_exp_avg = [s["exp_avg"].clone() for s in backend.critic.optimizer.state.values()]
    backend.train_rollout(samples, 1)  # moves the critic on
    assert any(not torch.equal(saved[k], v) for k, v in backend.critic.model.state_dict().items())
    backend.load(str(actor_dir), critic_directory=str(critic_dir))
    for k, v in backend.critic.model.state_dict().items():
        assert torch.equal(saved[k], v), k
    for want, state in zip(saved_exp_avg, backend.critic.optimizer.state.values(), strict=True):
        assert torch.equal(want, state["exp_avg"])


# ------------------------------------------------------------------ end to end
def _tensors(directory: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    out: dict[str, object] = {}
    for f in sorted(directory.glob("*.safetensors")):
        out.update({f"{f.name}:{k}": v for k, v in load_file(str(f)).items()})
    for f in sorted(directory.glob("*.pt")):
        out[f.name] = torch.load(f, weights_only=False)
    # the trainer seeds torch's generator; numpy's and Python's are the process's own, unseeded, so they differ
    # between any two runs, with or without --async-save
    out["rng.pt"] = out["rng.pt"]["torch"]
    return out


def _assert_same(a: object, b: object, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b), where
    elif isinstance(a, dict):
        assert isinstance(b, dict) and a.keys() == b.keys(), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}/{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert (a == b) if not hasattr(a, "shape") else (a == b).all(), where


@pytest.fixture(scope="module")
def kept_async(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Five steps saved every step in the background, keeping the newest two."""
    tmp = tmp_path_factory.mktemp("kept_async")
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "5", "--save", str(tmp / "ckpt"), "--save-interval", "1",
                         "--max-actor-ckpt-to-keep", "2", "--async-save", "--output-dir", str(tmp / "run")], tmp))
    return tmp


@pytest.mark.ray
def test_only_the_newest_n_checkpoints_remain_and_load_resumes_from_the_newest(kept_async: Path) -> None:
    save = kept_async / "ckpt"
    assert [d.name for d in sorted(save.iterdir()) if d.is_dir()] == ["iter_0000003", "iter_0000004"]
    assert (save / ckpt.LATEST_FILE).read_text().strip() == "4"
    events = read_jsonl(kept_async / "run" / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "checkpoint_saved"] == [0, 1, 2, 3, 4]
    out = kept_async / "resumed"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "6", "--load", str(save), "--output-dir", str(out)],
                        kept_async))
    assert [m["step"] for m in read_jsonl(out / "metrics.jsonl")] == [5]
    resume = next(e for e in read_jsonl(out / "events.jsonl") if e["event"] == "resume")
    assert resume["path"] == str(ckpt.iteration_dir(save, 4))


@pytest.mark.ray
def test_async_save_writes_the_same_checkpoints_as_a_plain_save(kept_async: Path, tmp_path: Path) -> None:
    plain = tmp_path / "ckpt"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "5", "--save", str(plain), "--save-interval", "1",
                         "--output-dir", str(tmp_path / "run")], tmp_path))
    for step in (3, 4):
        a, b = _tensors(ckpt.iteration_dir(kept_async / "ckpt", step)), _tensors(ckpt.iteration_dir(plain, step))
        assert sorted(a) == sorted(b) and any(k.startswith("model.safetensors:") for k in a)
        for key in a:
            _assert_same(a[key], b[key], f"step {step} {key}")


@pytest.mark.ray
def test_rotation_saves_every_step_and_keeps_the_interval_ones(tmp_path: Path) -> None:
    save = tmp_path / "ckpt"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "5", "--save", str(save), "--save-interval", "2",
                         "--rotate-ckpt", "--async-save", "--output-dir", str(tmp_path / "run")], tmp_path))
    events = read_jsonl(tmp_path / "run" / "events.jsonl")
    assert [e["step"] for e in events if e["event"] == "checkpoint_saved"] == [0, 1, 2, 3, 4]
    assert ckpt.saved_steps(save) == [1, 3, 4]  # steps 1 and 3 end an interval of 2; 4 is the newest


@pytest.mark.ray
def test_start_rollout_id_sets_the_first_step(kept_async: Path, tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "4", "--start-rollout-id", "2", "--output-dir", str(fresh)],
                        tmp_path))
    metrics = read_jsonl(fresh / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [2, 3] and metrics[0]["weight_version"] == 2
    over = tmp_path / "over_load"  # --load's checkpoint says step 5; the flag says 3
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "5", "--load", str(kept_async / "ckpt"),
                         "--start-rollout-id", "3", "--output-dir", str(over)], tmp_path))
    assert [m["step"] for m in read_jsonl(over / "metrics.jsonl")] == [3, 4]


@pytest.mark.ray
def test_critic_save_and_load_use_their_own_directory(tmp_path: Path) -> None:
    save, critic = tmp_path / "ckpt", tmp_path / "critic"
    ppo = [*FAST_FLAGS, "--advantage-estimator", "ppo"]
    assert_ok(run_relax([*ppo, "--num-rollout", "2", "--save", str(save), "--critic-save", str(critic),
                         "--output-dir", str(tmp_path / "a")], tmp_path))
    assert (ckpt.iteration_dir(critic, 1) / "critic.safetensors").exists()
    assert not (ckpt.iteration_dir(save, 1) / "critic.safetensors").exists()
    assert (critic / ckpt.LATEST_FILE).read_text().strip() == "1"
    assert_ok(run_relax([*ppo, "--num-rollout", "3", "--load", str(save), "--critic-load", str(critic),
                         "--output-dir", str(tmp_path / "b")], tmp_path))
    resume = next(e for e in read_jsonl(tmp_path / "b" / "events.jsonl") if e["event"] == "resume")
    assert resume["critic"] == str(ckpt.iteration_dir(critic, 1))
    assert json.loads((tmp_path / "b" / "run.json").read_text())["status"] == "completed"


# ------------------------------------------------------------------ a frozen model from a saved step
def test_opd_teacher_ckpt_step_loads_that_steps_weights(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend

    saver = TorchTrainBackend(TrainerConfig.from_args(parse_args(QUICK)), "cpu")
    root = tmp_path / "teacher"
    for step in (0, 1):  # two saved steps with different weights
        with torch.no_grad():
            for p in saver.model.parameters():
                p.add_(0.5)
        partial = ckpt.begin(root, step)
        saver.save(str(partial), save_optimizer=False)
        ckpt.publish(root, step)
    opd = [*QUICK, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", str(root)]
    for step in (0, 1):
        backend = TorchTrainBackend(TrainerConfig.from_args(parse_args([*opd, "--opd-teacher-ckpt-step", str(step)])),
                                    "cpu")
        want = load_file(str(ckpt.iteration_dir(root, step) / "model.safetensors"))
        got = backend.teacher.state_dict()
        assert all(torch.equal(got[k], v) for k, v in want.items())
    with pytest.raises(ConfigError, match=r"--opd-teacher-ckpt-step 5: no checkpoint of step 5 in .* \(saved steps: "
                                          r"0, 1\)"):
        parse_args([*opd, "--opd-teacher-ckpt-step", "5"])
    with pytest.raises(ConfigError, match="is not a relax train --save directory"):
        parse_args([*QUICK, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "tiny-qwen3",
                    "--opd-teacher-ckpt-step", "0"])


def _saved_steps(tmp_path: Path):
    """Two torch checkpoints of a quickstart policy (steps 0 and 1, each with its driver state, so --load takes it)."""
    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend

    saver = TorchTrainBackend(TrainerConfig.from_args(parse_args(QUICK)), "cpu")
    root = tmp_path / "ref"
    for step in (0, 1):
        with torch.no_grad():
            for p in saver.model.parameters():
                p.add_(0.5)
        partial = ckpt.begin(root, step)
        saver.save(str(partial), save_optimizer=False)
        ckpt.write_driver_state(partial, ckpt.DriverState(next_step=step + 1, weight_version=step + 1, data_source={}))
        ckpt.publish(root, step)
    return root


def _equal(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> bool:
    got = model.state_dict()
    return all(torch.equal(got[k], v) for k, v in state.items())


def test_ref_ckpt_step_picks_the_step_the_policy_starts_from_or_the_reference_holds(tmp_path: Path) -> None:
    """Seed 000: --ref-load is the initial checkpoint when --load is not set (policy and reference start from its
    --ref-ckpt-step, else its latest); with --load the reference alone holds it (the driver resumes the policy)."""
    from safetensors.torch import load_file

    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend

    root = _saved_steps(tmp_path)
    initial = TorchTrainBackend(TrainerConfig.from_args(parse_args(QUICK)), "cpu").model.state_dict()
    kl = [*QUICK, "--use-kl-loss", "--kl-loss-coef", "0.1", "--ref-load", str(root)]
    for flags, step in ((["--ref-ckpt-step", "0"], 0), ([], 1)):  # unset: the latest
        want = load_file(str(ckpt.iteration_dir(root, step) / "model.safetensors"))
        started = TorchTrainBackend(TrainerConfig.from_args(parse_args([*kl, *flags])), "cpu")
        assert _equal(started.ref_model, want) and _equal(started.model, want)
        resumed = TorchTrainBackend(TrainerConfig.from_args(parse_args([*kl, *flags, "--load", str(root)])), "cpu")
        assert _equal(resumed.ref_model, want) and _equal(resumed.model, initial)
        assert not _equal(resumed.model, want)
    with pytest.raises(ConfigError, match=r"--ref-ckpt-step 3: no checkpoint of step 3 in .* \(saved steps: 0, 1\)"):
        parse_args([*kl, "--ref-ckpt-step", "3"])
    with pytest.raises(ConfigError, match="--ref-ckpt-step requires --ref-load"):
        parse_args([*QUICK, "--ref-ckpt-step", "0"])


def test_ref_load_of_another_hf_model(tmp_path: Path) -> None:
    """--ref-load naming another HF model: with --load the reference is that model, any shape with the policy's
    vocabulary (a Llama against the Qwen3 policy); without --load the policy starts from it, so it must fit the
    policy's shape; a different vocabulary, or a path that is no model, is one line."""
    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.models import build_model

    root = _saved_steps(tmp_path)
    kl = [*QUICK, "--use-kl-loss", "--kl-loss-coef", "0.1"]
    resumed = TorchTrainBackend(TrainerConfig.from_args(parse_args([*kl, "--ref-load", "tiny-llama", "--load",
                                                                     str(root)])), "cpu")
    assert resumed.ref_model.config.model_type == "llama" and resumed.model.config.model_type == "qwen3"
    assert _equal(resumed.ref_model, build_model("tiny-llama", dtype=torch.float32, seed=resumed.cfg.seed).state_dict())
    with pytest.raises(ValueError, match=r"--ref-load tiny-llama: not a model of --hf-checkpoint tiny-qwen3's shape"):
        TorchTrainBackend(TrainerConfig.from_args(parse_args([*kl, "--ref-load", "tiny-llama"])), "cpu")
    with pytest.raises(ValueError, match=r"--ref-load tiny-qwen2.5-vl: vocab 104 differs from the policy's 100"):
        TorchTrainBackend(TrainerConfig.from_args(parse_args([*kl, "--ref-load", "tiny-qwen2.5-vl", "--load",
                                                              str(root)])), "cpu")
    with pytest.raises(ConfigError, match=rf"--ref-load {tmp_path}/nothing: no such directory"):
        parse_args([*kl, "--ref-load", str(tmp_path / "nothing")])


def test_a_checkpoint_of_the_other_backend_is_refused_as_a_model_in_one_line(tmp_path: Path) -> None:
    """--ref-load / --opd-teacher-load of a relax checkpoint: each backend reads only its own format (torch:
    model.safetensors; Megatron: the sharded mcore/ with megatron.json), named at parse time."""
    torch_dir, megatron_dir = tmp_path / "t", tmp_path / "m"
    torch_dir.mkdir()
    (torch_dir / "model.safetensors").write_bytes(b"")
    megatron_dir.mkdir()
    (megatron_dir / "megatron.json").write_text("{}")
    assert ckpt.backend_problems(torch_dir, "torch", "--ref-load") == []
    assert ckpt.backend_problems(megatron_dir, "megatron", "--ref-load") == []
    assert ckpt.backend_problems(torch_dir, "megatron", "--ref-load") == [
        f"--ref-load: {torch_dir} was saved by --train-backend torch; --train-backend megatron reads only its own "
        "checkpoints"]
    (line,) = ckpt.backend_problems(megatron_dir, "torch", "--opd-teacher-load")
    assert line.startswith(f"--opd-teacher-load: {megatron_dir} was saved by --train-backend megatron")
