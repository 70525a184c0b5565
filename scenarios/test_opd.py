"""On-policy distillation family: the student's KL to a trained teacher falls."""

import pytest


def test_opd_cpu(scenario):
    scenario("opd-cpu").assert_ok()


@pytest.mark.gpu
def test_opd_gpu(scenario):
    scenario("opd-gpu").assert_ok()
