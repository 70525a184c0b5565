"""ci/host_stalls.py: idle stretches between kernels are charged to the innermost host operator open at their
middle (its name) and to the innermost frame of our code among the open operators."""

from __future__ import annotations

from ci.decode_profile import Interval
from ci.host_stalls import HostOp, charge, describe, idle_stretches, own_frame


def test_only_stretches_longer_than_a_launch_gap_count() -> None:
    kernels = [Interval("a", 0, 10), Interval("b", 12, 20), Interval("c", 5, 15), Interval("d", 120, 130)]
    assert idle_stretches(kernels, short_us=10) == [(20, 120)]  # 10->12 is short; a and c overlap


def test_stretches_are_charged_to_the_innermost_operator_and_our_frame() -> None:
    kernels = [Interval("k", 0, 10), Interval("k", 110, 120), Interval("k", 150, 160), Interval("k", 400, 410)]
    ops = [HostOp("aten::item", 0, 130, "relax/backends/torch/backend.py(300): _apply_gradients"),
           HostOp("cudaStreamSynchronize", 20, 100),  # no Python stack: the frame comes from the caller
           HostOp("aten::copy_", 200, 300, "relax/x.py(1): f")]
    out = charge(kernels, ops, short_us=10)
    assert out["stretches"] == 3 and abs(out["idle_s"] - (100 + 30 + 240) / 1e6) < 1e-12
    top = {(t["op"], t["frame"]): (t["count"], t["idle_ms"]) for t in out["top"]}
    assert top[("cudaStreamSynchronize", "relax/backends/torch/backend.py(300): _apply_gradients")] == (1, 0.1)
    assert top[("aten::copy_", "relax/x.py(1): f")] == (1, 0.24)
    assert top[("(no operator: Python between ops)", "-")] == (1, 0.03)  # 120..150: its middle is outside every op
    assert out["top"][0]["op"] == "aten::copy_"  # largest first
    assert "aten::copy_" in describe(out)


def test_own_frame_skips_library_frames() -> None:
    stack = ["/usr/lib/python3/site-packages/torch/nn/modules/module.py(1): _call_impl",
             "/tmp/site/megatron/core/optimizer/clip_grads.py(120): get_grad_norm_fp32",
             "/repo/relax/backends/megatron/backend.py(200): _apply_gradients"]
    assert own_frame(stack) == "megatron/core/optimizer/clip_grads.py(120): get_grad_norm_fp32"
    assert own_frame(["/usr/lib/python3.11/threading.py(1): run"]) == "-" and own_frame(None) == "-"
