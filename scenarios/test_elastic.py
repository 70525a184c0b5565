"""Elastic-fleet family: engines join (equal at the current version before serving) and leave (drained,
aborted, their samples back in the buffer) a running fully-async job; a failed scale-out follows its policy."""

import pytest


def test_scale_out_midrun(scenario):
    scenario("scale-out-midrun").assert_ok()


def test_scale_in_midrun(scenario):
    scenario("scale-in-midrun").assert_ok()


def test_scale_out_failure_rollback(scenario):
    scenario("scale-out-failure-rollback").assert_ok()


def test_scale_out_failure_keep_partial(scenario):
    scenario("scale-out-failure-keep-partial").assert_ok()


def test_autoscale_policy(scenario):
    scenario("autoscale-policy").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("scale-out-in-gpu")
def test_scale_out_in_gpu(scenario):
    scenario("scale-out-in-gpu").assert_ok()
