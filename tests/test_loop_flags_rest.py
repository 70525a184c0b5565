"""The rest of the training-loop flags, without Ray: schedules, slices and one-line errors."""

from __future__ import annotations

from argparse import Namespace

from relax.core.runtime import Runtime


def _runtime(interval: int, start: int = 0) -> Runtime:
    return Runtime(Namespace(update_weights_interval=interval), None, None, None, None, start_step=start)


def test_update_weights_interval_schedule() -> None:
    rt = _runtime(3)
    assert [s for s in range(9) if rt.sync_due(s)] == [2, 5, 8]
    assert [rt.held_version(s) for s in range(7)] == [0, 0, 0, 3, 3, 3, 6]
    assert [rt.held_version(s) for s in range(4)] == [0, 0, 0, 3]
    one = _runtime(1)
    assert all(one.sync_due(s) for s in range(4)) and [one.held_version(s) for s in range(4)] == [0, 1, 2, 3]
    resumed = _runtime(2, start=3)  # resumed at step 3: the start push is version 3, the next sync after step 3
    assert [resumed.held_version(s) for s in (3, 4, 5, 6)] == [3, 4, 4, 6]
    assert resumed.held_version(1) == 3  # fully-async asks for step - k, which may be before the start


# ---------------------------------------------------------------- --reset-optimizer-states, --use-rollout-entropy
import pytest  # noqa: E402
import torch  # noqa: E402

from relax.backends.config import TrainerConfig  # noqa: E402
from relax.backends.torch.backend import TorchTrainBackend  # noqa: E402
from relax.utils.flag_types import ConfigError  # noqa: E402
from tests.test_train_loop_flags import _args, _samples  # noqa: E402

torch.set_num_threads(1)


def _backend(*flags: str) -> TorchTrainBackend:
    return TorchTrainBackend(TrainerConfig.from_args(_args("--lr", "0.02", *flags)), "cpu")


def _state_at_step_start(backend: TorchTrainBackend, steps: int) -> list[int]:
    """How many parameters have Adam state when each rollout's first optimizer step starts."""
    seen: list[int] = []
    original = backend._optimizer_step

    def spy(batch, gsl, *rest, **kw):
        if gsl.start == 0:
            seen.append(len(backend.optimizer.state))
        return original(batch, gsl, *rest, **kw)

    backend._optimizer_step = spy
    for step in range(steps):
        backend.train_rollout(_samples(seed=10 + step), step)
    return seen


def test_reset_optimizer_states_empties_adam_state_before_each_rollout() -> None:
    kept = _state_at_step_start(_backend(), 3)
    assert kept[0] == 0 and kept[1] > 0 and kept[2] > 0  # without the flag the moments carry over
    reset = _backend("--reset-optimizer-states")
    assert _state_at_step_start(reset, 3) == [0, 0, 0]
    steps = {int(s["step"]) for s in reset.optimizer.state.values()}
    assert steps == {2}  # the last rollout's two optimizer steps only: the step counts restarted
    moments = [s["exp_avg"] for s in reset.optimizer.state.values()]
    assert moments and any(m.abs().sum() > 0 for m in moments)  # and it still trains


def test_use_rollout_entropy_reaches_the_hook_and_the_metrics(tmp_path, monkeypatch) -> None:
    (tmp_path / "entropy_hook.py").write_text(
        "import torch\n"
        "SEEN = []\n"
        "def keep_uncertain(args, rollout_id, data):\n"
        "    SEEN.append(data['entropy'])\n"
        "    data['loss_masks'].mul_((data['entropy'] > 0.5).to(data['loss_masks'].dtype))\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import entropy_hook

    plain = _backend("--rollout-data-postprocess-path", "entropy_hook.keep_uncertain")
    with pytest.raises(TypeError):  # without the flag the hook gets no entropy (None > 0.5)
        plain.train_rollout(_samples(seed=10), 0)
    entropy_hook.SEEN.clear()
    backend = _backend("--use-rollout-entropy", "--rollout-data-postprocess-path", "entropy_hook.keep_uncertain")
    samples = _samples(seed=10)
    metrics = backend.train_rollout(samples, 0)
    (entropy,) = entropy_hook.SEEN
    assert entropy.shape == (len(samples), max(s.response_length for s in samples))
    # the entropy of the policy before the step: the same as the plain pass gives now, on a fresh copy
    fresh = _backend()
    from relax.backends.torch.batch import build_rollout_tensors

    batch = build_rollout_tensors(samples)
    lp, want = fresh._log_probs_and_entropy_no_grad(fresh.model, batch)
    assert torch.allclose(entropy, want)
    mask = batch.loss_mask
    assert metrics["train/rollout_entropy"] == pytest.approx(float((want * mask).sum() / mask.sum()), rel=1e-6)
    assert "train/rollout_entropy" not in _backend().train_rollout(_samples(seed=10), 0)


def test_megatron_refuses_a_reset_with_the_hybrid_cpu_optimizer_in_one_line() -> None:
    """Both flags work with --train-backend megatron on their own (tests/gpu/test_megatron_rl_flags_gpu.py); megatron's
    hybrid CPU optimizer keeps its own copies of the Adam state, so a reset with it is refused."""
    from relax.utils.validation import _train_loop

    args = _args("--reset-optimizer-states")
    args.train_backend = "megatron"  # this CPU machine refuses megatron itself before the rule runs
    args.optimizer_cpu_offload = True
    with pytest.raises(ConfigError, match="^not supported yet: --reset-optimizer-states with --optimizer-cpu-offload"):
        _train_loop(args)
    args.optimizer_cpu_offload = False
    _train_loop(args)


# ---------------------------------------------------------------- --ref-update-interval
KL = ("--use-kl-loss", "--kl-loss-coef", "0.05")


def _same_weights(a: torch.nn.Module, b: torch.nn.Module) -> bool:
    return all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))


def test_ref_update_interval_copies_the_actor_into_the_reference(tmp_path, monkeypatch) -> None:
    (tmp_path / "kl_hook.py").write_text(
        "SEEN = {}\n"
        "def record(args, rollout_id, data):\n"
        "    SEEN[rollout_id] = (data['log_probs'].clone(), data['ref_log_probs'].clone(), data['loss_masks'].clone())\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import kl_hook

    backend = _backend(*KL, "--ref-update-interval", "2", "--rollout-data-postprocess-path", "kl_hook.record")
    updated = []
    for step in range(4):
        metrics = backend.train_rollout(_samples(seed=10 + step), step)
        updated.append(metrics.get("train/ref_updated", 0.0))
        assert _same_weights(backend.model, backend.ref_model) == (step % 2 == 1), step
    assert updated == [0.0, 1.0, 0.0, 1.0]
    # the KL to the reference (old vs reference log-probs, over the loss mask) is 0 right after an update only
    for step, (lp, ref, mask) in kl_hook.SEEN.items():
        kl = float(((lp - ref).abs() * mask).sum())
        assert (kl == 0.0) == (step in (0, 2)), (step, kl)


def test_ref_update_interval_needs_a_reference_model() -> None:
    with pytest.raises(ConfigError, match="--ref-update-interval needs a reference model"):
        _args("--ref-update-interval", "2")
    with pytest.raises((ConfigError, SystemExit)):
        _args(*KL, "--ref-update-interval", "0")


# ---------------------------------------------------------------- --train-env-vars
def test_train_env_vars_reach_only_the_training_slots() -> None:
    from relax.distributed.config import PlacementConfig

    cfg = PlacementConfig.from_args(_args("--train-env-vars", '{"K": "V", "N": 3, "B": true}'))
    assert cfg.train_env() == {"K": "V", "N": "3", "B": "true"}


@pytest.mark.parametrize("value", ['["K"]', '{"K": {"nested": 1}}', '{"": "x"}'])
def test_train_env_vars_must_be_an_object_of_names(value: str) -> None:
    with pytest.raises(ConfigError, match="^--train-env-vars must be a JSON object of NAME: value"):
        _args("--train-env-vars", value)


# ---------------------------------------------------------------- --eval-min-new-tokens, --eval-max-context-len
def _eval_requests(*flags: str, prompt_lens=(3, 10, 40), min_new_tokens: int | None = None) -> list[dict]:
    """The /generate requests a default eval sends for prompts of ``prompt_lens`` tokens (a recording pool)."""
    import asyncio

    from relax.engine.rewards import RewardConfig
    from relax.engine.rollout import evaluation
    from relax.engine.rollout.config import RolloutConfig
    from relax.engine.rollout.eval_config import EvalConfig
    from relax.utils.types import Sample

    args = _args("--eval-interval", "1", *flags)
    sent: list[dict] = []

    class Pool:
        async def generate_batch(self, requests, n):
            sent.extend(requests)
            return [{"text": "", "output_ids": [], "meta_info": {"finish_reason": {"type": "length"},
                                                                 "output_token_logprobs": []}} for _ in requests]

    class State:
        pool = Pool()
        image_pad_id = None  # a text tokenizer's (GenerateState.image_pad_id)

    prompts = [Sample(prompt="p", tokens=list(range(n))) for n in prompt_lens]
    mp = pytest.MonkeyPatch()
    mp.setattr(evaluation, "GenerateState", lambda *a, **k: State())
    mp.setattr(evaluation, "apply_response", lambda s, r: None)

    async def no_rewards(cfg, samples):
        for s in samples:
            s.reward = 0.0

    mp.setattr(evaluation, "compute_rewards", no_rewards)
    mp.setattr(evaluation, "extract_reward", lambda r, k: 0.0)
    try:
        cfg = EvalConfig.from_args(args).replace(eval_min_new_tokens=min_new_tokens)  # sglang needs a GPU here
        asyncio.run(evaluation._evaluate_set(cfg, RolloutConfig.from_args(args),
                                             RewardConfig.from_args(args), 0, 0, evaluation.EvalSet("s", prompts)))
    finally:
        mp.undo()
    return sent


def test_eval_sampling_gets_min_new_tokens_and_the_context_cap() -> None:
    sent = _eval_requests("--eval-max-response-len", "16", "--eval-max-context-len", "20")
    assert [r["sampling_params"]["max_new_tokens"] for r in sent] == [16, 10, 0]
    assert all("min_new_tokens" not in r["sampling_params"] for r in sent)
    # unset: --rollout-max-context-len caps it
    sent = _eval_requests("--eval-max-response-len", "16", "--rollout-max-context-len", "12")
    assert [r["sampling_params"]["max_new_tokens"] for r in sent] == [9, 2, 0]
    sent = _eval_requests(min_new_tokens=4)
    assert {r["sampling_params"]["min_new_tokens"] for r in sent} == {4}


def test_eval_min_new_tokens_is_refused_on_the_embedded_engine() -> None:
    with pytest.raises(ConfigError, match="^not supported yet: --eval-min-new-tokens with --rollout-backend embedded"):
        _args("--eval-min-new-tokens", "4")
