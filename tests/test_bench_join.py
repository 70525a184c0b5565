"""ci/bench_join.py: the phases of a join, read from a run's events (the GPU run writes docs/results' JSON)."""

import pytest

from ci.bench_join import join_phases


def _events(joined: bool = True, served_at: float | None = 19.0) -> list[dict]:
    events = [{"event": "placement", "time": 0.0}, {"event": "process_started", "role": "engine:0", "time": 4.0},
              {"event": "scale_out_start", "engines": ["engine:1"], "time": 10.0},
              {"event": "process_started", "role": "engine:1", "url": "http://e1", "time": 13.0},
              {"event": "engine_healthy", "role": "engine:1", "url": "http://e1", "time": 14.5}]
    if joined:
        events.append({"event": "engine_joined", "role": "engine:1", "url": "http://e1", "version": 3, "time": 15.0})
    events.append({"event": "fleet_final", "time": 30.0,
                   "workers": [{"url": "http://e0", "served": 9, "first_request_at": 5.0},
                               {"url": "http://e1", "served": 4, "first_request_at": served_at}]})
    return events


def test_the_phases_are_the_gaps_between_the_joiners_events_and_the_start_is_set_against_the_first_engines():
    got = join_phases(_events())
    assert got["engine"] == "engine:1" and got["joined_version"] == 3 and got["served"] == 4
    assert got["phases_s"] == {"start": 3.0, "health": 1.5, "sync": 0.5, "first_request": 4.0}
    assert got["total_s"] == 9.0 and got["first_engine_start_s"] == 4.0 and got["start_over_first_engine_start"] == 0.75


def test_a_joiner_that_never_joined_or_never_served_is_an_error():
    with pytest.raises(ValueError, match="engine:1 did not join: no engine_joined event"):
        join_phases(_events(joined=False))
    with pytest.raises(ValueError, match="engine:1 joined but the router sent it no request"):
        join_phases(_events(served_at=None))
    with pytest.raises(ValueError, match="no scale_out_start event"):
        join_phases([{"event": "placement", "time": 0.0}])
