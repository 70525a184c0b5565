"""ci/run_figures.py: a run's step phases and sync s/GB come from its artifacts, checked against figures
computed by hand from the same records; bad artifacts give one line naming the file."""

from __future__ import annotations

import json

import pytest

from ci import run_figures as rf


def _write(path, records) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture()
def run_dir(tmp_path):
    steps = [(3.0, 2.0, 0.6, 0.30), (1.0, 0.5, 0.3, 0.10), (1.2, 0.6, 0.4, 0.12), (1.1, 0.55, 0.35, 0.11)]
    _write(tmp_path / "metrics.jsonl", [
        {"step": i, "perf/step_time_s": s, "perf/rollout_time_s": r, "perf/train_time_s": t, "perf/sync_time_s": y,
         "perf/offload_train_time_s": 0.01 * i} for i, (s, r, t, y) in enumerate(steps)])
    _write(tmp_path / "events.jsonl", [
        {"event": "run_start"},
        *({"event": "weights_synced", "step": i, "bytes": 500_000_000, "seconds": y, "transports": ["cuda-ipc"],
           "prepare_s": 0.01, "transfer_s": y - 0.03, "checksums_s": 0.02} for i, (_, _, _, y) in enumerate(steps))])
    (tmp_path / "run.json").write_text(json.dumps({"status": "completed", "device": "cuda", "config": {}}))
    return tmp_path


def test_step_phases_are_medians_of_the_timed_steps_with_their_shares(run_dir) -> None:
    fig = rf.figures(run_dir, warmup=1)
    step = fig["step"]
    assert step["steps"] == 4 and step["steps_timed"] == 3 and step["step_s"] == pytest.approx(1.1)
    assert step["phases_s"]["rollout"] == pytest.approx(0.55) and step["phases_s"]["train"] == pytest.approx(0.35)
    # other = step - rollout - train - sync per step: 0.1, 0.08, 0.09 -> median 0.09
    assert step["phases_s"]["other"] == pytest.approx(0.09)
    assert step["phases_share"]["rollout"] == pytest.approx(0.55 / 1.1)
    assert step["memory_moves_s"] == {"offload_train": pytest.approx(0.02)}
    assert fig["run"]["status"] == "completed" and fig["run"]["device"] == "cuda"


def test_sync_seconds_per_gb_and_its_phases(run_dir) -> None:
    sync = rf.figures(run_dir, warmup=1)["sync"]
    assert sync["syncs"] == 4 and sync["syncs_timed"] == 3 and sync["gb_per_sync"] == pytest.approx(0.5)
    assert sync["seconds"] == pytest.approx(0.11) and sync["s_per_gb"] == pytest.approx(0.22)
    assert sync["phases_s"]["transfer_s"] == pytest.approx(0.08) and sync["transports"] == ["cuda-ipc"]
    assert sync["phases_s_per_gb"]["checksums_s"] == pytest.approx(0.04)


def test_cli_prints_the_figures_and_writes_json_with_provenance(run_dir, tmp_path, capsys) -> None:
    out = tmp_path / "fig.json"
    assert rf.main([str(run_dir), "--warmup", "1", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "step 1.100 s = rollout 0.550 s (50%)" in text and "0.220 s/GB (median of 3)" in text
    data = json.loads(out.read_text())
    assert data["provenance"]["commit"] and data["sync"]["s_per_gb"] == pytest.approx(0.22)


def test_bad_artifacts_are_one_line_naming_the_file(run_dir, tmp_path, capsys) -> None:
    assert rf.main([str(tmp_path / "nowhere")]) == 2
    assert "metrics.jsonl: not found" in capsys.readouterr().err
    with (run_dir / "metrics.jsonl").open("a") as fh:
        fh.write("{not json\n")
    assert rf.main([str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("run_figures: ") and "metrics.jsonl:5: not JSON" in err and "\n" not in err
    _write(run_dir / "metrics.jsonl", [{"step": 0}])
    assert rf.main([str(run_dir), "--warmup", "0"]) == 2
    assert "missing key 'perf/step_time_s'" in capsys.readouterr().err
    assert rf.main([str(run_dir), "--warmup", "3"]) == 2
    assert "no step after the first 3" in capsys.readouterr().err
