"""Fully-async family: staleness-bounded rollout ahead of the trainer."""

import pytest


def test_fully_async_cpu(scenario):
    scenario("fully-async-cpu").assert_ok()


def test_fully_async_staleness0_equals_colocate_cpu(scenario):
    scenario("fully-async-staleness0-parity-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("fully-async-gpu")
def test_fully_async_gpu(scenario):
    scenario("fully-async-gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("fully-async-megatron-2gpu")
def test_fully_async_megatron_2gpu(scenario):
    scenario("fully-async-megatron-2gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("fully-async-megatron-services-4gpu")
def test_fully_async_megatron_services_4gpu(scenario):
    scenario("fully-async-megatron-services-4gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("fully-async-2gpu")
def test_fully_async_2gpu(scenario):
    scenario("fully-async-2gpu").assert_ok()
