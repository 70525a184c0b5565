"""Fully-async mode: max-staleness 0 equals colocate step by step; staleness never exceeds k."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]
KEYS = ("train/loss", "train/pg_loss", "train/grad_norm", "rollout/reward_mean", "train/ppo_kl")


def _run(tmp_path: Path, name: str, *flags: str) -> list[dict]:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "5", *flags, "--output-dir", str(tmp_path / name)], tmp_path)
    assert_ok(proc)
    return read_jsonl(tmp_path / name / "metrics.jsonl")


def test_staleness_zero_equals_colocate(tmp_path: Path) -> None:
    colocate = _run(tmp_path, "colocate")
    # the data queue's other knobs (several storage units, blocking metadata waits) run end to end in
    # test_staleness_is_bounded[k=2]; that they keep every sample and its order is tests/test_transfer_queue.py
    fully_async = _run(tmp_path, "async0", "--fully-async", "--max-staleness", "0")
    assert [m["step"] for m in fully_async] == list(range(5))
    for a, b in zip(colocate, fully_async, strict=True):
        for key in KEYS:
            assert abs(a[key] - b[key]) < 1e-6, f"step {a['step']} {key}: colocate {a[key]} vs fully-async {b[key]}"
        assert b["rollout/staleness_max"] == 0


@pytest.mark.parametrize(("k", "flags"), [(1, []), (2, ["--num-data-storage-units", "3", "--polling-mode", "false"])])
def test_staleness_is_bounded(tmp_path: Path, k: int, flags: list[str]) -> None:
    metrics = _run(tmp_path, f"async{k}", "--fully-async", "--max-staleness", str(k), *flags)
    staleness = [m["rollout/staleness_max"] for m in metrics]
    assert max(staleness) <= k, staleness
    assert max(staleness) >= 1, "rollout never ran ahead: the pipeline is not asynchronous"
    weights = read_jsonl(tmp_path / f"async{k}" / "weights.jsonl")
    for version in {r["version"] for r in weights}:
        sides = {r["side"]: r["checksums"] for r in weights if r["version"] == version}
        assert sides["engine:0"] == sides["trainer"], version
    fates = read_jsonl(tmp_path / f"async{k}" / "samples.jsonl")
    assert len({f["index"] for f in fates if f["fate"] == "trained"}) == 5 * 32


def test_fully_async_resume_loses_no_prompt(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    first = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--fully-async", "--max-staleness", "2", "--save", str(ckpt),
                       "--save-interval", "2", "--output-dir", str(tmp_path / "a")], tmp_path)
    assert_ok(first)
    second = run_relax([*FAST_FLAGS, "--num-rollout", "5", "--fully-async", "--max-staleness", "2", "--load", str(ckpt),
                        "--output-dir", str(tmp_path / "b")], tmp_path)
    assert_ok(second)
    trained_a = [f for f in read_jsonl(tmp_path / "a" / "samples.jsonl") if f["step"] <= 2 and f["fate"] == "trained"]
    trained_b = [f for f in read_jsonl(tmp_path / "b" / "samples.jsonl") if f["fate"] == "trained"]
    assert [m["step"] for m in read_jsonl(tmp_path / "b" / "metrics.jsonl")] == [3, 4]
    indices = sorted(f["index"] for f in trained_a + trained_b)
    assert indices == list(range(5 * 32)), "every sample index trained exactly once across the resume"
