"""Weight sync with Ray actors standing in for the trainer and engines: versions, checksums, snapshots.

The snapshot test is the regression for an engine restarted while the trainer is mid-step: the
restarted engine must get the last synced version's bytes, not the trainer's live weights.
"""

from __future__ import annotations

import pytest
import ray
import torch

from relax.metrics.artifacts import RunArtifacts
from relax.weights.checksum import state_checksums
from relax.weights.sync import resync_from_snapshot, sync_weights
from tests.e2e_helpers import in_process_ray, read_jsonl

pytestmark = [pytest.mark.ray]


@pytest.fixture(scope="module", autouse=True)
def local_ray(tmp_path_factory: pytest.TempPathFactory):
    yield from in_process_ray(tmp_path_factory.mktemp("ws"))


@ray.remote(num_cpus=0)
class FakeTrainer:
    """The trainer actor's sync protocol over a dict of tensors; ``step`` changes them like an optimizer."""

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.state = {f"w{i}": torch.randn(64, generator=g) for i in range(5)}
        self._buckets: list = []

    def step(self) -> None:
        for t in self.state.values():
            t.add_(0.5)

    def prepare_sync(self, bucket_bytes: int) -> tuple[int, str, int]:
        items = [(k, v.clone()) for k, v in self.state.items()]
        self._buckets = [items[i:i + 2] for i in range(0, len(items), 2)]
        return len(self._buckets), "cpu", sum(v.numel() * v.element_size() for _, v in items)

    def get_bucket(self, index: int, transport: str) -> list:
        assert transport == "object-store"  # a CPU trainer: nothing shares a GPU with it
        return self._buckets[index]

    def finish_sync(self) -> dict[str, str]:
        self._buckets = []
        return state_checksums(self.state.items())


@ray.remote(num_cpus=0)
class FakeEngine:
    def __init__(self) -> None:
        self.state: dict[str, torch.Tensor] = {}
        self.version = None

    def update_weights(self, bucket: list, version: int) -> int:
        self.state.update({k: v.clone() for k, v in bucket})
        self.version = version
        return version

    def checksums(self) -> dict[str, str]:
        return state_checksums(self.state.items())

    def device_identity(self) -> str:
        return "cpu"


def test_sync_records_equal_checksums_and_restart_gets_the_snapshot_not_live_weights(tmp_path) -> None:
    artifacts = RunArtifacts(tmp_path)
    trainer, engines = FakeTrainer.remote(), [FakeEngine.remote(), FakeEngine.remote()]
    _, snapshot = sync_weights(trainer, list(enumerate(engines)), version=3, step=2, bucket_bytes=1,
                               artifacts=artifacts, keep_snapshot=True)
    assert snapshot is not None and snapshot.version == 3 and len(snapshot.buckets) == 3
    ray.get(trainer.step.remote())  # the trainer is mid-step when engine 1 dies and is replaced
    replacement = FakeEngine.remote()
    resync_from_snapshot(snapshot, [(1, replacement)], step=3, artifacts=artifacts)
    records = read_jsonl(tmp_path / "weights.jsonl")
    assert {r["version"] for r in records} == {3}
    assert len({str(sorted(r["checksums"].items())) for r in records}) == 1  # trainer, engines, replacement
    assert ray.get(replacement.checksums.remote()) == snapshot.trainer_checksums
    live = ray.get(trainer.finish_sync.remote())
    assert live != snapshot.trainer_checksums  # the trainer really moved on


def test_without_keep_snapshot_no_bytes_are_kept(tmp_path) -> None:
    elapsed, snapshot = sync_weights(FakeTrainer.remote(), [(0, FakeEngine.remote())], version=1, step=0,
                                     bucket_bytes=1, artifacts=RunArtifacts(tmp_path))
    assert snapshot is None and elapsed > 0


def test_a_hung_engine_times_out_instead_of_blocking(tmp_path) -> None:
    @ray.remote(num_cpus=0)
    class HungEngine:
        def update_weights(self, bucket: list, version: int) -> int:
            import time

            time.sleep(8)
            return version

    with pytest.raises(ray.exceptions.GetTimeoutError):
        sync_weights(FakeTrainer.remote(), [(0, HungEngine.remote())], version=1, step=0, bucket_bytes=1,
                     artifacts=RunArtifacts(tmp_path), timeout=1.0)


def test_auto_transport_on_cpu_goes_through_the_object_store(tmp_path) -> None:
    artifacts = RunArtifacts(tmp_path)
    engine = FakeEngine.remote()
    sync_weights(FakeTrainer.remote(), [(0, engine)], version=1, step=0, bucket_bytes=1, artifacts=artifacts,
                 transport="auto")
    synced = [e for e in read_jsonl(tmp_path / "events.jsonl") if e["event"] == "weights_synced"]
    assert synced[-1]["transports"] == ["object-store"] and synced[-1]["bytes"] == 5 * 64 * 4
    records = read_jsonl(tmp_path / "weights.jsonl")
    assert records[0]["checksums"] == records[1]["checksums"]


def test_forced_cuda_ipc_with_the_weights_on_the_host_fails_clearly(tmp_path) -> None:
    with pytest.raises(RuntimeError, match="cuda-ipc: a sync target is on cpu, but the trainer's weights are on cpu"):
        sync_weights(FakeTrainer.remote(), [(0, FakeEngine.remote())], version=1, step=0, bucket_bytes=1,
                     artifacts=RunArtifacts(tmp_path), transport="cuda-ipc")
