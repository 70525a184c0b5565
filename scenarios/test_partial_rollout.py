"""Partial-rollout family: unfinished samples are aborted, recycled with their tokens and resumed; none is lost."""

import pytest


def test_partial_rollout_cpu(scenario):
    scenario("partial-rollout-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("partial-rollout-gpu")
def test_partial_rollout_gpu(scenario):
    scenario("partial-rollout-gpu").assert_ok()
