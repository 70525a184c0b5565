"""ci/bench_async_save.py's figures from a run's events: the wall from step 1's start to the run's end (after the last
write is durable) and the time blocked between a step's sync and its end, on events of the H200 runs it measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ci.bench_async_save import timeline

RUNS = Path(__file__).resolve().parents[1] / "docs" / "results" / "async_save_h200"


def _events(run: str, name: str) -> list[dict]:
    return [json.loads(line) for line in (RUNS / run / f"{name}_events.jsonl").open()]


def test_the_wall_runs_from_step_one_to_the_durable_end() -> None:
    events = [{"event": "step_start", "step": 0, "time": 0.0}, {"event": "weights_synced", "step": 0, "time": 5.0},
              {"event": "step_end", "step": 0, "time": 5.0}, {"event": "step_start", "step": 1, "time": 6.0},
              {"event": "weights_synced", "step": 1, "time": 7.0}, {"event": "checkpoint_saved", "step": 1, "time": 9.5},
              {"event": "step_end", "step": 1, "time": 10.0}, {"event": "run_end", "time": 10.5}]
    assert timeline(events) == {"wall_s": 4.5, "blocked_s": 3.0, "checkpoints": 1}


@pytest.mark.parametrize(("run", "ratio"), [("b512_interval2", 0.81), ("b32_interval3", 1.01)])
def test_the_committed_figures_come_from_the_committed_events(run: str, ratio: float) -> None:
    plain, background = timeline(_events(run, "plain")), timeline(_events(run, "async"))
    assert plain["checkpoints"] == background["checkpoints"] == 3
    assert round(background["wall_s"] / plain["wall_s"], 2) == ratio
    saved = json.loads((RUNS / run / "async_save.json").read_text())
    assert saved["plain"] == plain and saved["async_save"] == background
