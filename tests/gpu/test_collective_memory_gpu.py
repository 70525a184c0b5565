"""--enable-cuda-memory-check on CUDA (relax/observability/collective_memory.py): a two-rank torch trainer
all-reduces its gradients over NCCL, and every step leaves a collective_memory event in events.jsonl with the
device's free and total memory read before those all-reduces. The CPU twin (a fake mem_get_info):
tests/test_collective_memory.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu,
              pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")]


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
