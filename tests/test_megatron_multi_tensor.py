"""The foreach stand-ins for megatron's local multi-tensor fallbacks (relax/backends/megatron/multi_tensor.py):
the norm against float64, the scale bitwise against the fallback's ``dst.copy_(src * scale)``, and `install`
swapping only megatron's own fallbacks (run against stand-in modules: megatron-core does not run on CPU)."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from relax.backends.megatron import multi_tensor

shapes = st.lists(st.lists(st.integers(1, 9), min_size=1, max_size=3), min_size=1, max_size=6)


def _tensors(shape_list: list[list[int]], seed: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(*s, generator=g) * 10 ** torch.randint(-3, 4, (), generator=g)).to(dtype)
            for s in shape_list]


@settings(max_examples=100, deadline=None)
@given(shapes, shapes, st.integers(0, 2**31))
def test_l2_norm_is_the_norm_of_every_tensor_against_float64(first, second, seed) -> None:
    lists = [_tensors(first, seed), _tensors(second, seed + 1)]
    total, per_tensor = multi_tensor.foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), lists, True)
    flat = torch.cat([t.double().reshape(-1) for group in lists for t in group])
    assert total.shape == (1,) and total.dtype == torch.float32
    torch.testing.assert_close(total.double(), flat.norm().reshape(1), rtol=1e-6, atol=0)
    expected = torch.stack([t.double().norm() for group in lists for t in group])
    torch.testing.assert_close(per_tensor.double(), expected, rtol=1e-6, atol=0)
    assert multi_tensor.foreach_l2_norm(2048, torch.zeros(1), lists, False)[1] is None


def test_l2_norm_of_nothing_is_zero_and_bf16_norms_are_summed_in_fp32() -> None:
    total, _ = multi_tensor.foreach_l2_norm(2048, torch.zeros(1, dtype=torch.int), [[]], False)
    assert total.tolist() == [0.0]
    big = [torch.full((4,), 200.0, dtype=torch.bfloat16) for _ in range(3)]
    total, _ = multi_tensor.foreach_l2_norm(2048, torch.zeros(1), [big], False)
    assert total.dtype == torch.float32 and abs(float(total) - (12 * 200.0**2) ** 0.5) < 1e-3 * float(total)


@settings(max_examples=100, deadline=None)
@given(shapes, st.integers(0, 2**31), st.sampled_from([1.0, 0.5, 0.3141, 1e-3, 7.0]),
       st.sampled_from([torch.float32, torch.bfloat16]))
def test_scale_is_bitwise_the_fallbacks_copy_of_the_product(shape_list, seed, scale, dst_dtype) -> None:
    src = _tensors(shape_list, seed)
    ours = [torch.empty_like(t, dtype=dst_dtype) for t in src]
    theirs = [torch.empty_like(t, dtype=dst_dtype) for t in src]
    multi_tensor.foreach_scale(2048, torch.zeros(1), [src, ours], scale)
    for s, d in zip(src, theirs, strict=True):
        d.copy_(s * scale)  # megatron.core.utils.local_multi_tensor_scale
    assert all(torch.equal(a, b) for a, b in zip(ours, theirs, strict=True))


def test_scale_in_place_multiplies_once_and_a_unit_scale_leaves_the_tensors_alone() -> None:
    grads = _tensors([[5], [2, 3]], 3)
    expected = [g * 0.25 for g in grads]
    multi_tensor.foreach_scale(2048, torch.zeros(1), [grads, grads], 0.25)
    assert all(torch.equal(a, b) for a, b in zip(grads, expected, strict=True))
    before = [g.clone() for g in grads]
    multi_tensor.foreach_scale(2048, torch.zeros(1), [grads, grads], 1.0)
    assert all(torch.equal(a, b) for a, b in zip(grads, before, strict=True))


def test_scale_refuses_lists_of_different_lengths() -> None:
    with pytest.raises(ValueError, match="2 source tensors but 1 destinations"):
        multi_tensor.foreach_scale(2048, torch.zeros(1), [_tensors([[2], [3]], 0), _tensors([[2]], 0)], 2.0)


def _fake_megatron(monkeypatch, clip_impl, opt_scale) -> tuple[types.ModuleType, types.ModuleType]:
    def local_l2(*a):  # stand-ins for megatron.core.utils' fallbacks
        raise AssertionError("the fallback ran")

    def local_scale(*a):
        raise AssertionError("the fallback ran")

    utils = types.SimpleNamespace(local_multi_tensor_l2_norm=local_l2, local_multi_tensor_scale=local_scale)
    pick = {"local_l2": local_l2, "local_scale": local_scale}
    clip = types.ModuleType("megatron.core.optimizer.clip_grads")
    clip.l2_norm_impl, clip.multi_tensor_scale_impl = pick.get(clip_impl, clip_impl), local_scale
    opt = types.ModuleType("megatron.core.optimizer.optimizer")
    opt.multi_tensor_scale_impl = pick.get(opt_scale, opt_scale)
    core = types.ModuleType("megatron.core")
    core.utils = utils
    optimizer_pkg = types.ModuleType("megatron.core.optimizer")
    optimizer_pkg.clip_grads, optimizer_pkg.optimizer = clip, opt
    for name, module in (("megatron", types.ModuleType("megatron")), ("megatron.core", core),
                         ("megatron.core.utils", utils), ("megatron.core.optimizer", optimizer_pkg),
                         ("megatron.core.optimizer.clip_grads", clip), ("megatron.core.optimizer.optimizer", opt)):
        monkeypatch.setitem(sys.modules, name, module)
    return clip, opt


def test_install_swaps_megatrons_fallbacks_and_is_idempotent(monkeypatch) -> None:
    clip, opt = _fake_megatron(monkeypatch, "local_l2", "local_scale")
    names = ["clip_grads.l2_norm_impl", "clip_grads.multi_tensor_scale_impl", "optimizer.multi_tensor_scale_impl"]
    assert multi_tensor.install() == names
    assert clip.l2_norm_impl is multi_tensor.foreach_l2_norm
    assert clip.multi_tensor_scale_impl is multi_tensor.foreach_scale is opt.multi_tensor_scale_impl
    assert multi_tensor.install() == names  # a second backend in the process: already in place


def test_install_leaves_transformer_engine_or_apex_kernels_alone(monkeypatch) -> None:
    def apex_l2(*a):
        return None

    def apex_scale(*a):
        return None

    clip, opt = _fake_megatron(monkeypatch, apex_l2, apex_scale)
    assert multi_tensor.install() == ["clip_grads.multi_tensor_scale_impl"]
    assert clip.l2_norm_impl is apex_l2 and opt.multi_tensor_scale_impl is apex_scale
