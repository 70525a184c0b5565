"""relax/backends/embedded/weight_arena.py: every parameter a view of one buffer, fused groups back to back;
release + restore puts each parameter back at its view with its shape (values undefined until written)."""

from __future__ import annotations

import pytest
import torch

from relax.backends.embedded.weight_arena import ALIGN, WeightArena


def _params() -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(0)
    shapes = [(4, 3), (2, 3), (2, 3), (5,), (3, 3)]
    dtypes = [torch.float32] * 3 + [torch.bfloat16, torch.float32]
    return [torch.nn.Parameter(torch.randn(*s, generator=g).to(d), requires_grad=False)
            for s, d in zip(shapes, dtypes, strict=True)]


def test_groups_are_fused_views_and_values_are_kept() -> None:
    q, k, v, norm, o = params = _params()
    values = [p.detach().clone() for p in params]
    arena = WeightArena([[q, k, v], [norm], [o]], torch.device("cpu"))
    assert all(torch.equal(p, want) for p, want in zip(params, values, strict=True))
    fused = arena.group(0)
    assert fused.shape == (8, 3) and torch.equal(fused, torch.cat(values[:3]))
    k.data[0, 0] = 42.0  # an in-place update of a member is an update of the fused matrix
    assert fused[4, 0] == 42.0
    base = arena.buffer.data_ptr()
    assert all((p.data_ptr() - base) % ALIGN == 0 for p in (q, norm, o))  # each group starts aligned
    assert arena.holds() and [id(p) for p in arena.params] == [id(p) for p in params]


def test_release_and_restore_put_every_parameter_back_at_its_view() -> None:
    params = _params()
    arena = WeightArena([params[:3], [params[3]], [params[4]]], torch.device("cpu"))
    shapes = [p.shape for p in params]
    arena.release()
    for p in params:  # what the engine does to discarded weights
        p.data = torch.empty(0, dtype=p.dtype)
    assert arena.buffer is None and not arena.holds()
    arena.restore()
    assert [p.shape for p in params] == shapes and arena.holds()
    assert arena.group(0).data_ptr() == params[0].data_ptr()


def test_a_parameter_moved_elsewhere_is_noticed() -> None:
    params = _params()
    arena = WeightArena([params[:3], [params[3]], [params[4]]], torch.device("cpu"))
    params[2].data = params[2].data.clone()
    assert not arena.holds()


def test_a_group_needs_one_dtype_and_trailing_shape() -> None:
    a = torch.nn.Parameter(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="one dtype and one trailing shape"):
        WeightArena([[a, torch.nn.Parameter(torch.zeros(2, 4))]], torch.device("cpu"))
