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


def test_gpu_state_reads_nvidia_smi_and_is_empty_without_it(monkeypatch, tmp_path) -> None:
    from ci import provenance as prov

    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '580.95, P0, 1980 MHz, 2619 MHz, 1980 MHz, 2619 MHz, 700.00 W, 41'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    state = prov.gpu_state()["gpu_state"]
    assert state["driver_version"] == "580.95" and state["clocks.sm"] == "1980 MHz" and state["power.limit"] == "700.00 W"
    fake.write_text("#!/bin/sh\necho 'NVIDIA-SMI has failed' >&2; exit 9\n")
    assert prov.gpu_state() == {}
    monkeypatch.setenv("PATH", str(tmp_path / "none"))
    assert prov.gpu_state() == {}
