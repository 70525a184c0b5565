"""On-policy distillation family: the student's KL to a trained teacher falls, with the teacher in the
training backend (--opd-type megatron) or served by an engine server (--opd-type sglang)."""

import pytest


def test_opd_cpu(scenario):
    scenario("opd-cpu").assert_ok()


def test_opd_sglang_cpu(scenario):
    scenario("opd-sglang-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("opd-gpu")
def test_opd_gpu(scenario):
    scenario("opd-gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("opd-sglang-gpu")
def test_opd_sglang_gpu(scenario):
    scenario("opd-sglang-gpu").assert_ok()
