"""Parallel family: Megatron TP / PP / EP / DP and torch DP layouts through `relax train` on several GPUs
(scenarios/specs/parallel.yaml)."""

import pytest

LAYOUTS = ["megatron-tp2-sp-2gpu", "megatron-pp2-2gpu", "megatron-ep2-moe-2gpu", "megatron-dp2-distopt-2gpu",
           "megatron-tp2-dp2-4gpu", "torch-dp2-colocate-2gpu"]


@pytest.mark.gpu
@pytest.mark.multi_gpu
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.scenario(n)) for n in LAYOUTS])
def test_layout(scenario, name):
    scenario(name).assert_ok()
