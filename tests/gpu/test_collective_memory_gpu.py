"""--enable-cuda-memory-check on CUDA (relax/observability/collective_memory.py): a two-rank torch trainer
all-reduces its gradients over NCCL, and every step leaves a collective_memory event in events.jsonl with the
device's free and total memory read before those all-reduces; on one GPU, the check around a real NCCL all-reduce. The CPU twin (a fake mem_get_info):
tests/test_collective_memory.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.gpu]


@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_every_step_records_the_free_memory_before_its_gradient_all_reduces(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert_ok(run_relax([*FAST_FLAGS, "--device", "cuda", "--train-backend", "torch", "--num-rollout", "2",
                         "--resource", '{"actor": [1, 2], "rollout": [1, 2]}', "--enable-cuda-memory-check",
                         "--output-dir", str(run)], tmp_path))
    records = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "collective_memory"]
    assert [r["step"] for r in records] == [0, 1]
    total = torch.cuda.mem_get_info(0)[1]
    for r in records:
        assert r["rank"] == 0 and r["collectives"]["all_reduce(gradients)"] >= 1
        assert r["total_bytes"] == total and 0 < r["min_free_bytes"] < total


@pytest.fixture
def nccl_world_of_one(tmp_path: Path):
    import torch.distributed as dist

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("nccl", store=store, rank=0, world_size=1, device_id=torch.device("cuda", 0))
    yield
    dist.destroy_process_group()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_a_real_nccl_all_reduce_reads_the_devices_free_memory(nccl_world_of_one) -> None:
    """One GPU: the check around a real NCCL all-reduce reads torch's real free / total memory, and a failing one
    (a host tensor on NCCL) carries it in its note."""
    from relax.backends.torch import data_parallel
    from relax.observability import collective_memory
    from relax.observability.collective_memory import CollectiveMemoryConfig

    collective_memory.configure(CollectiveMemoryConfig(enable_cuda_memory_check=True), rank=0)
    try:
        grads = [torch.ones(1024, device="cuda")]
        data_parallel._all_reduce_flat(grads)
        assert torch.equal(grads[0], torch.ones(1024, device="cuda"))
        summary = collective_memory.CHECK.pop_summary()
        free, total = torch.cuda.mem_get_info()
        assert summary["collectives"] == {"all_reduce(gradients)": 1} and summary["total_bytes"] == total
        assert 0 < summary["min_free_bytes"] <= total and abs(summary["min_free_bytes"] - free) < total // 10
        with pytest.raises(Exception) as failure:  # noqa: B017 - NCCL's own error for a host tensor
            data_parallel._all_reduce_flat([torch.ones(4)])
        assert any(n.startswith("--enable-cuda-memory-check: collective all_reduce(gradients) on rank 0: ")
                   for n in failure.value.__notes__)
    finally:
        collective_memory.configure(CollectiveMemoryConfig(enable_cuda_memory_check=False))
