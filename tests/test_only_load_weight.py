"""--only-load-weight (seed 000): the reference model and the actor_fwd copy load model weights only. Here that is
how they are always built: the flag is accepted, and the forward-only copy the services run has no optimizer and
no gradient state, and a reference taken from a --save directory reads only its model weights."""

from __future__ import annotations

from relax.backends.config import TrainerConfig
from relax.backends.train_registry import build_train_backend
from relax.utils.arguments import parse_args
from tests.e2e_helpers import FAST_FLAGS


def test_forward_copies_and_the_reference_hold_weights_only() -> None:
    args = parse_args([*FAST_FLAGS, "--only-load-weight", "--use-kl-loss", "--kl-loss-coef", "0.1"])
    assert args.only_load_weight is True
    trainer = build_train_backend(TrainerConfig.from_args(args), "cpu")
    fwd = build_train_backend(TrainerConfig.from_args(args), "cpu", service="actor_fwd")
    assert fwd.optimizer is None and not any(p.requires_grad for p in fwd.model.parameters())
    assert trainer.optimizer is not None
    ref = trainer.ref_model
    assert ref is not None and not any(p.requires_grad for p in ref.parameters())
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert not in_optimizer & {id(p) for p in ref.parameters()}
