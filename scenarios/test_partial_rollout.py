"""Partial-rollout family: aborted samples are recycled, none is lost."""

import pytest
from _waits import partial_rollout


@partial_rollout
def test_partial_rollout_cpu(scenario):
    scenario("partial-rollout-cpu").assert_ok()


@pytest.mark.gpu
@partial_rollout
def test_partial_rollout_gpu(scenario):
    scenario("partial-rollout-gpu").assert_ok()
