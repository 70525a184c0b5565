"""The warm driver (tests/driver_forks.py) reports a run as a fresh ``python -m relax.cli`` process would."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e_helpers import FAST_FLAGS, _shared_cluster_env, warm_driver


@pytest.fixture(scope="module")
def warm():
    driver = warm_driver(_shared_cluster_env())
    if driver is None:
        pytest.skip("RELAX_TEST_FRESH_DRIVERS=1: runs start fresh drivers")
    return driver


def test_a_forked_run_prints_and_exits_as_a_fresh_process(warm, tmp_path: Path) -> None:
    # a flag error (exit 2, one line on stderr) and a missing file named relative to the run's directory
    argv = ["train", *FAST_FLAGS, "--num-rollout", "0", "--load", "no_such_ckpt", "--lr", "-1"]
    env = _shared_cluster_env()
    forked = warm.run(argv, env, tmp_path, timeout=120)
    fresh = subprocess.run([sys.executable, "-m", "relax.cli", *argv], capture_output=True, text=True, env=env,
                           cwd=tmp_path, timeout=120)
    assert forked is not None, warm.differences(env)
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and "no_such_ckpt" in forked.stderr


def test_a_run_whose_environment_matters_at_import_is_not_forked(warm, tmp_path: Path) -> None:
    env = _shared_cluster_env()
    assert not warm.differences({**env, "RELAX_FAULT_NAN_LOSS_AT_STEP": "1", "PYTHONPATH": str(tmp_path)})
    for key, value in (("OMP_NUM_THREADS", "2"), ("HF_HUB_OFFLINE", "0"), ("RAY_AUTH_MODE", "token")):
        assert not warm.accepts({**env, key: value}), key
        assert warm.run(["train", "--help"], {**env, key: value}, tmp_path, timeout=60) is None


def test_a_run_past_its_timeout_is_killed_and_reported_as_subprocess_does(warm, tmp_path: Path) -> None:
    argv = ["train", *FAST_FLAGS, "--num-rollout", "50", "--output-dir", str(tmp_path / "run")]
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        warm.run(argv, _shared_cluster_env(), tmp_path, timeout=3)
    assert caught.value.timeout == 3
    again = warm.run(["train", "--lr", "-1"], _shared_cluster_env(), tmp_path, timeout=120)  # the server serves on
    assert again is not None and again.returncode == 2
    assert os.path.isdir(tmp_path)
