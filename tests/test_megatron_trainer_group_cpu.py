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

from relax.backends.megatron.checks import module_available

pytestmark = [pytest.mark.megatron, pytest.mark.ray,
              pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core")]

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ray_with_megatron_shims(tmp_path_factory):
    import ray

    from relax.distributed.placement import worker_env
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


def test_rank_zero_takes_its_tensor_parallel_peer_along(ray_with_megatron_shims, monkeypatch, tmp_path) -> None:
    import ray
    import transformers as tf

    from relax.distributed.actors import TrainerActor
    from relax.distributed.trainer_group import TrainerGroup
    from relax.models import build_config
    from relax.utils.arguments import parse_args
    from relax.weights.checksum import state_checksums
    from tests.e2e_helpers import pretend_gpu_machine

    pretend_gpu_machine(monkeypatch)
    args = parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", "2", "--no-bias-swiglu-fusion",
                       "--no-bias-dropout-fusion", "--resource", '{"actor": [2, 2]}',
                       "--tensor-model-parallel-size", "2"])
    group = TrainerGroup.start(TrainerActor, args, "cpu", 2, {"num_cpus": 0, "max_concurrency": 2})
    leader = group.leader
    described = ray.get(leader.describe.remote())
    assert described["parallel"]["tp"] == 2 and described["data_parallel_size"] == 1
    metrics = ray.get(leader.train_rollout.remote(_samples(), 0))
    assert torch.isfinite(torch.tensor(metrics["train/grad_norm"]))

    num_buckets, where, nbytes = ray.get(leader.prepare_sync.remote(64 * 1024))
    assert num_buckets > 1 and where == "cpu"
    sent = [pair for i in range(num_buckets) for pair in ray.get(leader.get_bucket.remote(i, "object-store"))]
    sums = ray.get(leader.finish_sync.remote())
    assert state_checksums(sent) == sums and sum(t.numel() * t.element_size() for _, t in sent) == nbytes
    engine = tf.Qwen3ForCausalLM(build_config("small-qwen3")).to(torch.bfloat16)
    engine.load_state_dict(dict(sent), strict=True)  # full HF tensors: exactly the engine's names and shapes

    ray.get(leader.save.remote(str(tmp_path / "ckpt"), True))
    assert (tmp_path / "ckpt" / "megatron.json").exists() and len(list((tmp_path / "ckpt" / "rng").iterdir())) == 2
    ray.get(leader.train_rollout.remote(_samples(), 1))
    ray.get(leader.load.remote(str(tmp_path / "ckpt")))
    ray.get(leader.prepare_sync.remote(1 << 30))
    assert ray.get(leader.finish_sync.remote()) == sums  # the checkpoint's weights are back on both ranks

    ray.get(leader.save_hf.remote(str(tmp_path / "hf")))
    reloaded = tf.AutoModelForCausalLM.from_pretrained(str(tmp_path / "hf"), dtype=torch.bfloat16)
    assert state_checksums(reloaded.state_dict().items()) == sums
    for actor in group.actors:
        ray.kill(actor, no_restart=True)
