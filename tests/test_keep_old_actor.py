"""--keep-old-actor: the old log-probs come from the weights the engines generated with.

With --update-weights-interval 2 the engines hold version 0 (the initial weights) for steps 0 and 1 and
the weights after step 1 for steps 2 and 3. The old log-probs at step 1 must be the initial weights'
log-probs with the flag, the current (after step 0) weights' without it.
"""

from __future__ import annotations

import copy

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import build_rollout_tensors
from relax.utils.flag_types import ConfigError
from tests.test_train_loop_flags import _args, _samples


def _backend(*flags: str) -> TorchTrainBackend:
    return TorchTrainBackend(TrainerConfig.from_args(_args("--lr", "0.05", "--update-weights-interval", "2", *flags)),
                             "cpu")


def _run(backend: TorchTrainBackend, steps: int) -> list[dict]:
    """Train ``steps`` rollouts; per step: the old log-probs used, and the log-probs of the weights at step start
    and of each synced version's weights (the copy of the model kept at each step that ends with a sync)."""
    seen: list[dict] = []
    original = backend._rollout_columns
    synced = copy.deepcopy(backend.model)  # version 0: the initial weights

    def spy(batch, pre, *, old=True):
        out = original(batch, pre, old=old)
        seen[-1]["old"] = out[0]
        seen[-1]["current"] = backend._log_probs_no_grad(backend.model, batch)
        seen[-1]["synced"] = backend._log_probs_no_grad(synced, batch)
        return out

    backend._rollout_columns = spy
    for step in range(steps):
        seen.append({})
        metrics = backend.train_rollout(_samples(seed=20 + step), step)
        seen[-1]["metrics"] = metrics
        if (step + 1) % 2 == 0:  # the runtime syncs the engines after this step
            synced.load_state_dict(backend.model.state_dict())
    return seen


def test_old_log_probs_between_syncs_are_the_synced_versions() -> None:
    kept = _run(_backend("--keep-old-actor"), 4)
    for step, s in enumerate(kept):
        assert torch.equal(s["old"], s["synced"]), step
        assert s["metrics"]["train/old_actor_refreshed"] == float(step % 2 == 1)
    # steps 1 and 3 come between syncs: the trainer's weights moved on, the old policy did not
    for step in (1, 3):
        assert not torch.allclose(kept[step]["old"], kept[step]["current"]), step
    plain = _run(_backend(), 4)
    for step, s in enumerate(plain):  # without the flag: the trainer's current weights, always
        assert torch.equal(s["old"], s["current"]), step
    assert not torch.allclose(plain[1]["old"], plain[1]["synced"])
    # both start from the same weights: step 0 is the same either way
    assert torch.equal(kept[0]["old"], plain[0]["old"])


def test_interval_one_keeps_the_current_weights() -> None:
    backend = TorchTrainBackend(TrainerConfig.from_args(_args("--lr", "0.05", "--keep-old-actor")), "cpu")
    for step in range(2):
        backend.train_rollout(_samples(seed=30 + step), step)
        assert all(torch.equal(p, q) for p, q in zip(backend.old_actor.model.parameters(),
                                                      backend.model.parameters(), strict=True))


def test_resume_refreshes_the_copy(tmp_path) -> None:
    trained = _backend()
    trained.train_rollout(_samples(seed=20), 0)
    trained.save(str(tmp_path), save_optimizer=True)
    resumed = _backend("--keep-old-actor")
    resumed.load(str(tmp_path))
    batch = build_rollout_tensors(_samples(seed=21))
    assert torch.equal(resumed._log_probs_no_grad(resumed.old_actor.model, batch),
                       trained._log_probs_no_grad(trained.model, batch))


@pytest.mark.parametrize(("extra", "message"), [
    (("--fully-async",), "not supported yet: --keep-old-actor with --fully-async"),
    (("--use-routing-replay",), "not supported yet: --keep-old-actor with routing replay"),
])
def test_refusals(extra: tuple[str, ...], message: str) -> None:
    from relax.utils.validation import _train_loop

    args = _args("--keep-old-actor")
    if extra[0] == "--fully-async":
        args.fully_async = True
    else:
        args.use_routing_replay = True
    with pytest.raises(ConfigError, match=f"^{message}"):
        _train_loop(args)
