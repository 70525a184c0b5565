"""ci/provenance.py: a bench JSON's command names the engine's A/B switches that were set for the run."""

from __future__ import annotations

import os
import shlex

from ci.provenance import provenance


def test_command_opens_with_the_decode_switches_that_were_set(monkeypatch) -> None:
    for name in [n for n in os.environ if n.startswith("RELAX_DECODE_")]:
        monkeypatch.delenv(name)
    assert provenance(["ci/bench_engine.py", "--batches", "64"])["command"].split()[1:] == [
        "ci/bench_engine.py", "--batches", "64"]
    monkeypatch.setenv("RELAX_DECODE_SAMPLER", "0")
    monkeypatch.setenv("RELAX_DECODE_PDL", "0")
    monkeypatch.setenv("RELAX_OTHER", "1")  # not a decode switch: not in the command
    words = shlex.split(provenance(["ci/bench_engine.py"])["command"])
    assert words[:2] == ["RELAX_DECODE_PDL=0", "RELAX_DECODE_SAMPLER=0"] and words[3:] == ["ci/bench_engine.py"]
