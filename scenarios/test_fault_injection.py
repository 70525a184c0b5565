"""Fault family: kills, hangs and engine-hook faults, each with its declared outcome."""

import pytest


def test_engine_killed_mid_rollout_recovers_cpu(scenario):
    result = scenario("fault-engine-kill-cpu")
    assert any(f["role"] == "engine:0" and f["signal"] == "SIGKILL" for f in result.run().faults)
    result.assert_ok()


def test_trainer_killed_recovers_cpu(scenario):
    scenario("fault-trainer-kill-cpu").assert_ok()


def test_engine_hang_recovers_cpu(scenario):
    scenario("fault-engine-hang-cpu").assert_ok()


def test_http_faults_to_one_engine_are_absorbed_cpu(scenario):
    scenario("fault-http-proxy-cpu").assert_ok()


def test_reward_raise_fails_fast_cpu(scenario):
    scenario("fault-reward-raise-cpu").assert_ok()


def test_nan_loss_fails_fast_cpu(scenario):
    scenario("fault-nan-loss-cpu").assert_ok()


def test_checkpoint_write_failure_fails_fast_cpu(scenario):
    scenario("fault-ckpt-write-fail-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("fault-engine-kill-gpu")
def test_engine_killed_recovers_gpu(scenario):
    scenario("fault-engine-kill-gpu").assert_ok()
