"""Parallel family: Megatron TP / PP / EP / DP and torch DP layouts through `relax train` on several GPUs
(scenarios/specs/parallel.yaml). GPU only: Megatron does not run on CPU, and the CPU data-parallel run is
parity-dp2-cpu."""

import pytest


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("megatron-tp2-sp-2gpu")
def test_megatron_tp2_sp_2gpu(scenario):
    scenario("megatron-tp2-sp-2gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("megatron-pp2-2gpu")
def test_megatron_pp2_2gpu(scenario):
    scenario("megatron-pp2-2gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("megatron-ep2-moe-2gpu")
def test_megatron_ep2_moe_2gpu(scenario):
    scenario("megatron-ep2-moe-2gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("megatron-dp2-distopt-2gpu")
def test_megatron_dp2_distopt_2gpu(scenario):
    scenario("megatron-dp2-distopt-2gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("megatron-tp2-dp2-4gpu")
def test_megatron_tp2_dp2_4gpu(scenario):
    scenario("megatron-tp2-dp2-4gpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.scenario("torch-dp2-colocate-2gpu")
def test_torch_dp2_colocate_2gpu(scenario):
    scenario("torch-dp2-colocate-2gpu").assert_ok()
