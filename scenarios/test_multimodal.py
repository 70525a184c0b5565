"""Multimodal family: a vision-language model learns a picture question (expected to pass)."""
import pytest


def test_vlm_learns_cpu(scenario):
    scenario("vlm-learns-cpu").assert_ok()


@pytest.mark.gpu
@pytest.mark.scenario("vlm-gpu")
def test_vlm_gpu(scenario):
    scenario("vlm-gpu").assert_ok()
