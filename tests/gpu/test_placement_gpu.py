"""Placement on real GPUs (relax/distributed/placement.py): colocate packs rank i and engine i on GPU i.

Seed 001's layout ``{"actor": [1, N], "rollout": [1, N]}`` with ``--colocate`` on N GPUs must train on N
ranks (one per GPU, NCCL) and serve from N engines, each engine on its rank's GPU, with equal weights on
every side after every sync. On one GPU the quickstart keeps trainer and engine on that GPU.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _started(run: Path) -> dict[str, list[str]]:
    return {e["role"]: e["gpu_ids"] for e in read_jsonl(run / "events.jsonl") if e["event"] == "process_started"}


def _weights_equal(run: Path, versions: int) -> None:
    records = read_jsonl(run / "weights.jsonl")
    for version in range(versions):
        sides = {r["side"]: r["checksums"] for r in records if r["version"] == version}
        assert "trainer" in sides and all(c == sides["trainer"] for c in sides.values()), version


def test_one_gpu_colocate_shares_it(tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert_ok(run_relax([*FAST_FLAGS, "--device", "cuda", "--num-rollout", "2", "--output-dir", str(run)], tmp_path))
    gpus = _started(run)
    assert gpus["trainer:0"] == gpus["engine:0"] and len(gpus["trainer:0"]) == 1
    _weights_equal(run, 3)


@pytest.mark.multi_gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_seed_colocate_layout_trains_on_every_gpu(tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--device", "cuda", "--num-rollout", "3", "--resource",
                      '{"actor": [1, 2], "rollout": [1, 2]}', "--output-dir", str(run)], tmp_path)
    assert_ok(proc)
    gpus = _started(run)
    assert sorted(gpus) == ["engine:0", "engine:1", "trainer:0", "trainer:1"]
    assert gpus["trainer:0"] == gpus["engine:0"] and gpus["trainer:1"] == gpus["engine:1"]
    assert gpus["trainer:0"] != gpus["trainer:1"]  # one GPU per rank: NCCL refuses two ranks on one GPU
    assert "'data_parallel_size': 2" in proc.stdout + proc.stderr
    _weights_equal(run, 4)
