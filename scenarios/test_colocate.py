"""Colocate family: the training loop as shipped (expected to pass)."""

import pytest


def test_colocate_cpu(scenario):
    scenario("colocate-cpu").assert_ok()


def test_colocate_two_engines_cpu(scenario):
    scenario("colocate-two-engines-cpu").assert_ok()


def test_colocate_reset_tensors_cpu(scenario):
    scenario("colocate-reset-tensors-cpu").assert_ok()


def test_true_on_policy_cpu(scenario):
    scenario("true-on-policy-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("true-on-policy-gpu")
def test_true_on_policy_gpu(scenario):
    scenario("true-on-policy-gpu").assert_ok()


@pytest.mark.slow
def test_colocate_learns_cpu(scenario):
    scenario("colocate-learns-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("colocate-gpu")
def test_colocate_gpu(scenario):
    scenario("colocate-gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("colocate-megatron-gpu")
def test_colocate_megatron_gpu(scenario):
    scenario("colocate-megatron-gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.slow
@pytest.mark.scenario("colocate-megatron-0.5b-gpu")
def test_colocate_megatron_05b_gpu(scenario):
    scenario("colocate-megatron-0.5b-gpu").assert_ok()
