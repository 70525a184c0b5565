"""Both weight-sync transports end to end on CPU, into two engines, in small buckets, checksums equal at
every version: ``distributed`` (SGLang's update_weights_from_distributed over gloo; NCCL between GPUs
is the same protocol) and ``tensor`` (update_weights_from_tensor with named shared-memory segments,
the host counterpart of the colocate CUDA IPC path)."""

from __future__ import annotations

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]


@pytest.mark.parametrize("transport", ["distributed", "tensor"])
def test_sync_reaches_both_engines_bitwise(tmp_path, transport) -> None:
    out = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--resource", '{"rollout": [2, 0]}',
                      "--weight-sync-transport", transport, "--update-weight-buffer-size", "64KB",
                      "--output-dir", str(out)], tmp_path)
    assert_ok(proc)
    synced = [e for e in read_jsonl(out / "events.jsonl") if e["event"] == "weights_synced"]
    assert [e["version"] for e in synced] == [0, 1, 2]
    assert all(e["transports"] == [transport] and e["buckets"] > 1 and e["engines"] == [0, 1] for e in synced)
    by_version: dict[int, dict[str, dict]] = {}
    for r in read_jsonl(out / "weights.jsonl"):
        by_version.setdefault(r["version"], {})[r["side"]] = r["checksums"]
    assert sorted(by_version) == [0, 1, 2]
    for version, sides in by_version.items():
        assert set(sides) == {"trainer", "engine:0", "engine:1"}
        assert sides["engine:0"] == sides["trainer"] == sides["engine:1"], f"version {version}"
    assert by_version[1]["trainer"] != by_version[2]["trainer"]  # the weights really moved
