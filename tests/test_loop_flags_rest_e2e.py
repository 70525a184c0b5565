"""The rest of the training-loop flags through the CLI (real Ray trainer + engine, CPU quickstart).

One run of 5 steps carries several flags whose effects do not interfere:

- ``--update-weights-interval 2``: ``weights_synced`` only at start (version 0) and after steps 1 and 3
  (versions 2 and 4); the samples of steps 1 and 3 carry the older version (staleness 1 in samples.jsonl).
- ``--train-env-vars``: a ``--rollout-data-postprocess-path`` hook, run in the trainer actor, sees the
  variables, which the driver's own environment lacks.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.ray]

HOOK = """
import os

def record_env(args, rollout_id, data):
    with open(os.environ["LOOPFLAGS_OUT"], "a") as f:
        f.write(f"{rollout_id} {os.environ.get('LOOPFLAGS_MARK')} {os.getpid()}\\n")
"""


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("loop_flags_rest")
    (tmp / "loopflags_hook.py").write_text(HOOK)
    env = {"LOOPFLAGS_MARK": "seen", "LOOPFLAGS_OUT": str(tmp / "env.txt")}
    assert not any(k in os.environ for k in env)
    flags = [*FAST_FLAGS, "--num-rollout", "5", "--update-weights-interval", "2", "--check-weight-update-equal",
             "--train-env-vars", json.dumps(env), "--rollout-data-postprocess-path", "loopflags_hook.record_env",
             "--output-dir", str(tmp / "run")]
    # a private cluster: its workers import the hook from PYTHONPATH (the driver's environment)
    assert_ok(run_relax(flags, tmp, env={"PYTHONPATH": f"{tmp}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"},
                        private_cluster=True))
    return tmp / "run"


def test_weights_are_synced_every_second_step(run: Path) -> None:
    synced = [e for e in read_jsonl(run / "events.jsonl") if e["event"] == "weights_synced"]
    assert [(e["version"], e["step"]) for e in synced] == [(0, 0), (2, 1), (4, 3)]
    # the equality check ran at each of those syncs: trainer and engine agree at every version
    records = read_jsonl(run / "weights.jsonl")
    assert sorted({r["version"] for r in records}) == [0, 2, 4]
    for version in (0, 2, 4):
        sides = [r for r in records if r["version"] == version]
        trainer = next(r for r in sides if r["side"] == "trainer")["checksums"]
        engines = [r["checksums"] for r in sides if r["side"].startswith("engine:")]
        assert engines and all(e == trainer for e in engines), f"version {version}"


def test_the_steps_between_syncs_generate_with_the_older_version(run: Path) -> None:
    trained = [r for r in read_jsonl(run / "samples.jsonl") if r["fate"] == "trained"]
    by_step = {step: {(r["weight_version"], r["staleness"]) for r in trained if r["step"] == step} for step in range(5)}
    assert by_step == {0: {(0, 0)}, 1: {(0, 1)}, 2: {(2, 0)}, 3: {(2, 1)}, 4: {(4, 0)}}
    metrics = read_jsonl(run / "metrics.jsonl")
    assert [m["weight_version"] for m in metrics] == [0, 0, 2, 2, 4]
    assert [m["rollout/staleness_max"] for m in metrics] == [0, 1, 0, 1, 0]


def test_the_trainer_sees_the_train_env_vars(run: Path) -> None:
    lines = [line.split() for line in (run.parent / "env.txt").read_text().splitlines()]
    assert [(step, mark) for step, mark, _ in lines] == [(str(s), "seen") for s in range(5)]
    trainer_pid = next(e["pid"] for e in read_jsonl(run / "events.jsonl")
                       if e["event"] == "process_started" and e["role"].startswith("trainer"))
    assert {int(pid) for *_, pid in lines} == {trainer_pid}
