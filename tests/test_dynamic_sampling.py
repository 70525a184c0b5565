"""Over-sampling with a dynamic-sampling filter (DAPO): rejected groups are recorded as filtered,
surplus groups are recycled and trained later; the harness's accounting check passes on the run."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.artifacts import RunArtifacts
from harness.checks import CheckContext, Status, parse_check
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]
DAPO = "relax.engine.filters.dynamic_sampling_filters.check_reward_nonzero_std"


def _accounting(run: Path):
    context = CheckContext(runs={"main": RunArtifacts.load(run)}, root=run)
    return parse_check({"kind": "sample_accounting"}).run_check(context)


def test_dapo_filter_trains_only_groups_with_reward_variance(tmp_path: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--over-sampling-batch-size", "16",
                      "--dynamic-sampling-filter-path", DAPO, "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    fates = read_jsonl(tmp_path / "run" / "samples.jsonl")
    filtered = [f for f in fates if f["fate"] == "filtered"]
    assert filtered and all(f["reason"].startswith("zero_std_") for f in filtered)
    for m in read_jsonl(tmp_path / "run" / "metrics.jsonl"):
        assert m["rollout/num_samples"] == 32 and m["rollout/reward_std"] > 0
    result = _accounting(tmp_path / "run")
    assert result.status is Status.PASSED, result.message


def test_over_sampling_surplus_is_recycled_not_lost(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "keep_all.py").write_text("def keep(args, samples, **kw):\n    return True\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "3", "--over-sampling-batch-size", "12",
                      "--dynamic-sampling-filter-path", "keep_all.keep", "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    fates = read_jsonl(tmp_path / "run" / "samples.jsonl")
    recycled = {(f["group_index"], f["index"]) for f in fates if f["fate"] == "recycled"}
    trained_later = {(f["group_index"], f["index"]) for f in fates if f["fate"] == "trained" and f["attempts"] == 2}
    assert recycled and recycled & trained_later, "recycled groups come back and get trained"
    result = _accounting(tmp_path / "run")
    assert result.status is Status.PASSED, result.message
