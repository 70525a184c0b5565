"""The one line that names a failed engine when fault tolerance is off (EngineFleet.failure), from the
driver's main thread, where no event loop runs."""

from __future__ import annotations

from relax.backends.embedded.launch import EngineProcess
from relax.core.engines import EngineFleet
from relax.engine.launcher import EngineRecord
from relax.weights.transports import SyncTarget


def test_an_error_without_a_url_is_pinned_on_the_engine_that_stopped_answering() -> None:
    alive = EngineProcess.start(["--hf-checkpoint", "tiny-qwen3"])
    try:
        dead = "http://127.0.0.1:9"  # the discard port: nothing answers /health there
        records = [EngineRecord(0, SyncTarget("engine:0", alive.url)), EngineRecord(1, SyncTarget("engine:1", dead))]
        fleet = EngineFleet(launcher=None, records=records, router=None)
        error = fleet.failure(ConnectionResetError("Connection reset by peer"))  # names no engine
    finally:
        alive.stop()
    assert str(error) == (f"engine:1 ({dead}) failed: Connection reset by peer; rerun with --use-fault-tolerance "
                          "to restart engines")
