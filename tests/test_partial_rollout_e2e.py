"""A real partial-rollout run (embedded engine behind Ray, aborts through its HTTP API) with the
buffer filter, the train-data converter and the rollout-data post-process hook all set: every
prompt has a fate, no sample exceeds the abort limit, recycled samples come back with their tokens
(masked where an older policy made them) and each hook is called every step. Aborts and resumes
themselves are pinned down deterministically in test_partial_rollout.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.artifacts import RunArtifacts
from harness.checks import CheckContext, Status, parse_check
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]
MAX_ABORTS = 1
# letters and digits stop a response: lengths vary, so slow groups may be cut mid-generation
STOP_IDS = [str(i) for i in range(3, 39)]

HOOKS = '''
import json, os

def _log(kind, **fields):
    with open(os.environ["HOOK_LOG"], "a") as f:
        f.write(json.dumps({"hook": kind, **fields}) + "\\n")

def oldest_first(args, rollout_id, buffer, num_samples):
    _log("buffer_filter", buffered=len(buffer), asked=num_samples)
    return buffer[:num_samples]

def convert(args, samples):
    _log("convert", samples=len(samples), resumed=sum(s.abort_count > 0 for s in samples))
    rewards = [float(s.reward) for s in samples]
    return {"tokens": [s.tokens for s in samples], "response_lengths": [s.response_length for s in samples],
            "rewards": rewards, "loss_masks": [s.loss_mask for s in samples],
            "rollout_log_probs": [s.rollout_log_probs for s in samples]}

def postprocess(args, rollout_id, rollout_data):
    masks, lengths = rollout_data["loss_masks"], rollout_data["response_lengths"]
    _log("postprocess", rollout_id=rollout_id, masked=sum(int((masks[i, :n] == 0).sum()) for i, n in enumerate(lengths)))
'''


def _partial_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *flags: str) -> tuple[Path, list[dict], list[dict]]:
    """A 5-step partial-rollout run with every hook; its dir, metrics and hook calls, checked for what holds in
    every mode."""
    (tmp_path / "pr_hooks.py").write_text(HOOKS)
    log = tmp_path / "hooks.jsonl"
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    monkeypatch.setenv("HOOK_LOG", str(log))
    run = tmp_path / "run"
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "5", "--partial-rollout", "--mask-offpolicy-in-partial-rollout",
                      "--partial-rollout-max-aborted-count", str(MAX_ABORTS), "--over-sampling-batch-size", "16",
                      "--rollout-max-response-len", "16", "--rollout-stop-token-ids", *STOP_IDS,
                      "--buffer-filter-path", "pr_hooks.oldest_first",
                      "--custom-convert-samples-to-train-data-path", "pr_hooks.convert",
                      "--rollout-data-postprocess-path", "pr_hooks.postprocess", *flags, "--output-dir", str(run)],
                     tmp_path, private_cluster=True)  # the hooks read HOOK_LOG: a private cluster's workers inherit it
    assert_ok(proc)
    context = CheckContext(runs={"main": RunArtifacts.load(run)}, root=run)
    for check in ({"kind": "sample_accounting"}, {"kind": "weight_equality"}):
        result = parse_check(check).run_check(context)
        assert result.status is Status.PASSED, result.message
    fates = [f for f in read_jsonl(run / "samples.jsonl") if f["fate"] != "consumed"]  # fate decisions only
    # whether a left-over group is cut or already finished depends on timing; either way it is recycled
    assert {f["reason"] for f in fates if f["fate"] == "recycled"} <= {"partial_rollout_abort", "partial_rollout_surplus"}
    assert max(f["attempts"] for f in fates) <= MAX_ABORTS + 1, "a sample was aborted more often than allowed"
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["rollout/recycled_groups"] for m in metrics] == [8.0] * 5, "16 groups drawn, 8 trained, 8 recycled"
    assert max(m["rollout/abort_count_max"] for m in metrics) <= MAX_ABORTS
    calls = [json.loads(line) for line in log.read_text().splitlines()]
    assert any(c["hook"] == "buffer_filter" for c in calls)
    assert [c["samples"] for c in calls if c["hook"] == "convert"] == [32] * 5
    post = [c for c in calls if c["hook"] == "postprocess"]
    assert [c["rollout_id"] for c in post] == [0, 1, 2, 3, 4]
    assert sum(m["rollout/offpolicy_tokens"] for m in metrics) > 0
    assert [c["masked"] for c in post] == [m["rollout/offpolicy_tokens"] for m in metrics], \
        "exactly the off-policy tokens reach the trainer with loss mask 0"
    return run, metrics, calls


def test_partial_rollout_run_with_every_hook(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _partial_run(tmp_path, monkeypatch)


def test_partial_rollout_with_fully_async_runs_ahead_within_the_staleness(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Each step's rollout is a partial rollout started on weights at most --max-staleness versions old; a recycled
    sample resumes on newer weights, its older tokens masked."""
    run, metrics, _ = _partial_run(tmp_path, monkeypatch, "--fully-async", "--max-staleness", "1")
    starts = [m["rollout/start_version"] for m in metrics]
    assert all(k - 1 <= v <= k for k, v in enumerate(starts)), starts
    assert any(v < k for k, v in enumerate(starts)), f"the rollout never ran ahead of training: {starts}"
    assert sum(m["rollout/resumed_samples"] for m in metrics) > 0, "no aborted sample was resumed"
    events = read_jsonl(run / "events.jsonl")
    assert [e["version"] for e in events if e["event"] == "weights_synced"] == [0, 1, 2, 3, 4, 5]
