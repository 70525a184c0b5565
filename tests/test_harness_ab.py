"""The same-machine A/B gate, end to end on the harness's fake engine (steps of 50 ms spent sleeping, so an
A/B of 5 + 5 runs costs about 3 s of CPU). The planted regression is the engine hook RELAX_FAULT_ENGINE_SLOWDOWN
(relax/utils/fault_hooks.py), read by the fake engine's step exactly as by the embedded engine's."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from harness.ab import REPO, ABConfig, ABError, check_imports, run_ab, schedule
from harness.spec import ScenarioSpec

FAKE = [sys.executable, "-m", "harness.fake_engine"]
SPEC = ScenarioSpec.model_validate({
    "name": "tput", "engine_flags": ["--num-rollout", "6", "--fake-step-s", "0.05", "--rollout-batch-size", "2",
                                     "--n-samples-per-prompt", "2", "--engines", "0"],
    "checks": [{"kind": "sample_accounting"}, {"kind": "throughput", "skip_steps": 1}]})


def ab(tmp_path: Path, name: str, spec: ScenarioSpec = SPEC, **env: str) -> dict:
    cfg = ABConfig(base="HEAD", spec=spec, results_dir=tmp_path / name, runs=5, engine_cmd=FAKE, candidate_env=env)
    return run_ab(cfg, log=lambda line: None)


def test_abba_schedule() -> None:
    assert schedule(3) == ["candidate", "base", "base", "candidate", "candidate", "base"]


def test_self_ab_passes_ten_times_and_a_planted_30_percent_slowdown_fails(tmp_path: Path) -> None:
    outcomes = [ab(tmp_path, f"self{i}")["ab"] for i in range(10)]
    assert [o["ok"] for o in outcomes] == [True] * 10, [o["verdict"] for o in outcomes]
    # 200 ms steps for the planted regression: on a loaded 2-core CI machine the fake engine's few ms of CPU per
    # step wobble by tens of ms, which at 50 ms steps blurs a 23% drop against the gate's 10% minimum effect
    long_steps = SPEC.with_overrides(engine_flags=[f if f != "0.05" else "0.2" for f in SPEC.engine_flags])
    slowed = ab(tmp_path, "slow", long_steps, RELAX_FAULT_ENGINE_SLOWDOWN="0.3")["ab"]
    assert not slowed["ok"], slowed["verdict"]
    assert slowed["p"] < 0.05 and slowed["slowdown"] > 0.10  # steps 1.3x as long: about 23% fewer samples/s
    assert [r["side"] for r in slowed["runs"]] == schedule(5)


def test_each_side_runs_its_own_checkout(tmp_path: Path) -> None:
    """The base's runs import the base worktree's code (the fake engine records where relax came from)."""
    out = ab(tmp_path, "where")
    paths = {}
    for res in out["results"]:
        run_json = json.loads((Path(res.runs[0].output_dir) / "run.json").read_text())
        side = res.name.split("[")[1].split()[0]
        paths.setdefault(side, set()).add(str(Path(run_json["versions"]["relax_path"]).parent.parent))
    assert paths["candidate"] == {str(REPO)}
    (base_root,) = paths["base"]
    assert base_root != str(REPO) and Path(base_root).name == "base" and "relax-ab-" in base_root
    assert not Path(base_root).exists()  # the worktree is removed afterwards


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(ABError, match="not that checkout's code"):
        check_imports(tmp_path, {})  # an empty dir: relax would come from elsewhere
    with pytest.raises(ABError, match="no throughput check"):
        run_ab(ABConfig(base="HEAD", spec=SPEC.with_overrides(checks=[{"kind": "sample_accounting"}]),
                        results_dir=tmp_path, engine_cmd=FAKE))
    with pytest.raises(ABError, match="git rev-parse"):
        run_ab(ABConfig(base="no-such-ref-xyz", spec=SPEC, results_dir=tmp_path, engine_cmd=FAKE))
    broken = SPEC.with_overrides(engine_flags=[*SPEC.engine_flags, "--fake-fail", "boom"])
    with pytest.raises(ABError, match="candidate run 1 of tput failed"):
        run_ab(ABConfig(base="HEAD", spec=broken, results_dir=tmp_path / "b", runs=2, engine_cmd=FAKE))
