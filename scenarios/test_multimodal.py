"""Multimodal family: a vision-language model learns a picture question (expected to pass)."""


def test_vlm_learns_cpu(scenario):
    scenario("vlm-learns-cpu").assert_ok()
