"""Parity family: DP1 vs DP2 (gloo), micro-batch 1 vs N, straight vs resume, torch vs megatron."""

import pytest


def test_microbatch_1_vs_n_cpu(scenario):
    scenario("parity-microbatch-cpu").assert_ok()


def test_straight_vs_resume_cpu(scenario):
    scenario("parity-resume-cpu").assert_ok()


def test_dp1_vs_dp2_cpu(scenario):
    scenario("parity-dp2-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("parity-dp2-gpu")
def test_dp1_vs_dp2_gpu(scenario):
    scenario("parity-dp2-gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("parity-microbatch-gpu")
def test_microbatch_1_vs_n_gpu(scenario):
    scenario("parity-microbatch-gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("parity-torch-vs-megatron-gpu")
def test_torch_vs_megatron_gpu(scenario):
    scenario("parity-torch-vs-megatron-gpu").assert_ok()
