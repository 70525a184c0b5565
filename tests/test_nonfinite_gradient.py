"""The non-finite-gradient error names where the blow-up is (first parameters in order)."""

from __future__ import annotations

import torch

from relax.backends.config import TrainerConfig
from relax.backends.nonfinite import nonfinite_gradient_error


def test_names_the_first_parameters_with_inf_or_nan() -> None:
    named = [("embed", torch.ones(3)), ("layers.0.w", torch.tensor([1.0, float("nan")])), ("frozen", None),
             ("layers.1.w", torch.tensor([float("inf")])), ("head", torch.zeros(2))]
    err = nonfinite_gradient_error(named, float("nan"), 0.5)
    assert isinstance(err, FloatingPointError)
    assert str(err) == ("non-finite gradient norm (nan); loss was 0.5; non-finite gradients in 2 parameter(s), "
                        "first: layers.0.w, layers.1.w")


def test_says_when_only_the_norm_overflowed() -> None:
    err = nonfinite_gradient_error([("w", torch.full((2,), 3e38))], float("inf"), None)
    assert "every gradient is finite, the norm itself overflowed" in str(err)


def test_torch_backend_raises_it_before_stepping(tmp_path) -> None:
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.utils.arguments import parse_args

    args = parse_args(["--preset", "quickstart", "--output-dir", str(tmp_path)])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    before = {n: p.detach().clone() for n, p in backend.model.named_parameters()}
    for p in backend.model.parameters():
        p.grad = torch.zeros_like(p)
    first = next(n for n, _ in backend.model.named_parameters())
    dict(backend.model.named_parameters())[first].grad[0] = float("nan")
    try:
        backend._apply_gradients(1.0)
    except FloatingPointError as exc:
        assert f"first: {first}" in str(exc)
    else:
        raise AssertionError("no FloatingPointError")
    assert all(torch.equal(p, before[n]) for n, p in backend.model.named_parameters())
