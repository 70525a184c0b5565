"""The trainer group with the Megatron backend under Ray: two rank actors in one process group, TP = 2.

The ranks are real `TrainerActor`s (relax/distributed/actors.py) joined by the driver-hosted
rendezvous (trainer_group.py); megatron-core runs on CPU over gloo through tests/megatron_workers.py's
shims, installed in each Ray worker by ``worker_process_setup_hook``. Rank 0 alone is called, as
the driver does, and must take its peer along: a training step, the weight export for a sync
(buckets of full HF tensors on rank 0, the checksums of what was sent), a sharded checkpoint saved
and loaded by both ranks, and ``--save-hf`` written once. Needs megatron-core (marker ``megatron``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available

pytestmark = [pytest.mark.megatron, pytest.mark.ray,
              pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_with_megatron_shims(tmp_path_factory):
    import ray

    from relax.distributed.cluster import worker_env
    from tests.e2e_helpers import _ray_dir

    env = {**worker_env(), "PYTHONPATH": str(ROOT)}
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level=logging.WARNING,
             _temp_dir=str(_ray_dir(tmp_path_factory.mktemp("ray"))),
             runtime_env={"env_vars": env, "worker_process_setup_hook": "tests.megatron_workers.install_cpu_shims"})
    yield
    ray.shutdown()


def _samples() -> list:
    from relax.backends.torch.batch import TrainSample

    g = torch.Generator().manual_seed(0)
    return [TrainSample(tokens=torch.randint(3, 100, (12 + i,), generator=g).tolist(), response_length=6,
                        loss_mask=[1] * 6, reward=float(i % 2)) for i in range(8)]


@pytest.mark.parametrize("model, parallel", [("small-qwen3", ["--tensor-model-parallel-size", "2"]),
                                             ("small-qwen3-moe", ["--expert-model-parallel-size", "2"])],
                         ids=["tp2", "ep2-moe"])
def test_rank_zero_takes_its_parallel_peer_along(ray_with_megatron_shims, monkeypatch, tmp_path, model: str,
                                                 parallel: list[str]) -> None:
    import ray
    import transformers as tf

    from relax.backends.embedded.launch import EngineProcess
    from relax.distributed.actors import TrainerActor
    from relax.distributed.trainer_group import TrainerGroup
    from relax.models import build_model
    from relax.models.checkpoint_names import checkpoint_state, moe_style
    from relax.utils.arguments import parse_args
    from relax.weights.checksum import state_checksums
    from relax.weights.devices import device_identity
    from relax.weights.push import PushOptions
    from relax.weights.transports import SyncTarget
    from tests.e2e_helpers import pretend_gpu_machine

    pretend_gpu_machine(monkeypatch)
    args = parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", model,
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", "2", "--no-bias-swiglu-fusion",
                       "--no-bias-dropout-fusion", "--no-rope-fusion", "--resource", '{"actor": [2, 2]}',
                       *parallel])
    group = TrainerGroup.start(TrainerActor, TrainerConfig.from_args(args), "cpu",
                               [{"num_cpus": 0, "max_concurrency": 2}] * 2,
                               timeout_minutes=args.distributed_timeout_minutes)
    leader = group.leader
    described = ray.get(leader.describe.remote())
    sizes = described["parallel"]
    assert (sizes["tp"], sizes["ep"]) == ((2, 1) if model == "small-qwen3" else (1, 2))
    metrics = ray.get(leader.train_rollout.remote(_samples(), 0))
    assert torch.isfinite(torch.tensor(metrics["train/grad_norm"]))

    # the push streams rank 0's full HF tensors to a real engine server while the peer takes part in the gathers
    engine = EngineProcess.start(["--hf-checkpoint", model, "--dtype", "bfloat16"])
    try:
        target = SyncTarget("engine:0", engine.url, device_identity("cpu"))
        report = ray.get(leader.push_weights.remote([target], 1, PushOptions(bucket_bytes=64 * 1024, timeout_s=120)))
        assert report.buckets > 1 and report.target_checksums["engine:0"] == report.trainer_checksums
        sums = report.trainer_checksums
        hf = build_model(model)
        expected = checkpoint_state(hf.state_dict(), moe_style(hf.config))  # MoE experts under checkpoint names
        assert set(sums) == set(expected)  # full HF tensors: exactly the engine's names

        ray.get(leader.save.remote(str(tmp_path / "ckpt"), True))
        assert (tmp_path / "ckpt" / "megatron.json").exists() and len(list((tmp_path / "ckpt" / "rng").iterdir())) == 2
        ray.get(leader.train_rollout.remote(_samples(), 1))
        ray.get(leader.load.remote(str(tmp_path / "ckpt")))
        again = ray.get(leader.push_weights.remote([target], 2, PushOptions(bucket_bytes=1 << 30, timeout_s=120)))
        assert again.trainer_checksums == sums  # the checkpoint's weights are back on both ranks
        assert again.target_checksums["engine:0"] == sums
    finally:
        engine.stop()

    ray.get(leader.save_hf.remote(str(tmp_path / "hf")))
    reloaded = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.bfloat16)
    assert state_checksums(checkpoint_state(reloaded.state_dict(), moe_style(reloaded.config)).items()) == sums
    for actor in group.actors:
        ray.kill(actor, no_restart=True)
