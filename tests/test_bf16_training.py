"""``--bf16`` with the torch backend: bf16 weights and activations, fp32 master weights and gradient
accumulation, bf16 exports (engines hold the same dtype), exact checkpoint resume."""

from __future__ import annotations

from pathlib import Path

import torch

from relax.backends.config import TrainerConfig
from relax.backends.embedded.config import EmbeddedEngineConfig
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.train_registry import weight_dtype
from relax.utils.arguments import parse_args
from tests.metric_helpers import no_timings
from tests.test_train_loop_flags import BASE, _samples

torch.set_num_threads(1)


def _backend(*flags: str) -> TorchTrainBackend:
    return TorchTrainBackend(TrainerConfig.from_args(parse_args([*BASE, "--bf16", *flags])), "cpu")


def test_bf16_weights_fp32_masters_and_rounded_updates() -> None:
    backend = _backend()
    assert all(p.dtype == torch.bfloat16 for p in backend.model.parameters())
    masters = list(backend.master.params)
    assert all(m.dtype == torch.float32 for m in masters)
    assert backend.optimizer.param_groups[0]["params"] == masters  # the optimizer steps the masters
    before = [m.detach().clone() for m in masters]
    metrics = backend.train_rollout(_samples(seed=1), 0)
    assert metrics["train/num_optimizer_steps"] == 2 and torch.isfinite(torch.tensor(metrics["train/loss"]))
    moved = [not torch.equal(a, m) for a, m in zip(before, masters, strict=True)]
    assert sum(moved) > len(moved) // 2
    for p, m in zip(backend.master.model_params, masters, strict=True):
        assert torch.equal(p.detach(), m.detach().to(torch.bfloat16))  # the model holds the masters rounded
        assert p.grad is None  # bf16 gradients were folded into the masters and freed


def test_updates_below_bf16_resolution_are_kept_by_the_masters() -> None:
    """With a small learning rate most updates round away in bf16; the fp32 masters keep them."""
    backend = _backend("--lr", "1e-5")
    before = [m.detach().clone() for m in backend.master.params]
    backend.train_rollout(_samples(seed=5), 0)
    kept = sum(int(((m != a) & (m.to(torch.bfloat16) == a.to(torch.bfloat16))).sum())
               for a, m in zip(before, backend.master.params, strict=True))
    assert kept > 1000, kept


def test_gradients_accumulate_in_fp32_across_micro_batches() -> None:
    """One micro-batch or four: the same fp32 master gradient up to bf16 forward noise, not bf16 accumulation."""
    grads = []
    for micro in ("8", "2"):
        backend = _backend("--micro-batch-size", micro, "--lr", "0")
        backend.train_rollout(_samples(seed=2), 0)
        grads.append(torch.cat([m.grad.flatten() for m in backend.master.params if m.grad is not None]))
        assert all(m.grad is None or m.grad.dtype == torch.float32 for m in backend.master.params)
    rel = float((grads[0] - grads[1]).norm() / grads[0].norm())
    assert rel < 2e-2, rel


def test_exports_are_bf16_and_the_engine_dtype_follows() -> None:
    backend = _backend()
    assert {t.dtype for _, t in backend.device_named_tensors()} == {torch.bfloat16}
    assert backend.describe()["dtype"] == "bfloat16"
    assert weight_dtype("torch", True) == torch.bfloat16 and weight_dtype("torch") == torch.float32
    assert weight_dtype("megatron") == torch.bfloat16


def test_checkpoint_resume_restores_the_masters_exactly(tmp_path: Path) -> None:
    a = _backend()
    a.train_rollout(_samples(seed=3), 0)
    a.save(str(tmp_path / "ckpt"), save_optimizer=True)
    b = _backend()
    b.load(str(tmp_path / "ckpt"))
    for x, y in zip(a.master.params, b.master.params, strict=True):
        assert torch.equal(x, y)
    ma, mb = a.train_rollout(_samples(seed=4), 1), b.train_rollout(_samples(seed=4), 1)
    assert no_timings(ma) == no_timings(mb)  # perf/ timings differ run to run
    for (name, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), name


def _engine_vs_trainer(device: str, tmp_path: Path) -> float:
    """Train a Qwen2 HF directory one step in bf16, push its weights to an engine built the way engine actors
    build theirs (the export dtype), sample, and return the mean |engine - trainer| log-prob of those tokens."""
    from relax.backends.torch.batch import TrainSample, build_rollout_tensors
    from relax.distributed.engine_actor import build_engine
    from tests.hf_dirs import arithmetic_corpus, bpe_tokenizer, hf_dir

    path = hf_dir(tmp_path / "qwen2", "qwen2", bpe_tokenizer(arithmetic_corpus()), seed=4)
    args = parse_args([*BASE, "--bf16", "--hf-checkpoint", str(path), "--device", device])
    backend = TorchTrainBackend(TrainerConfig.from_args(args), device)
    assert backend.model.config._attn_implementation == "sdpa"  # HF directories load with SDPA
    backend.train_rollout(_samples(seed=6, vocab=200), 0)
    engine = build_engine(EmbeddedEngineConfig.from_args(args), device)
    assert {p.dtype for p in engine.model.parameters()} == {torch.bfloat16}
    engine.update_weights_from_tensors(backend.device_named_tensors())
    prompt = [5, 17, 33, 8]
    out = engine.generate([{"input_ids": prompt, "sampling_params": {"max_new_tokens": 8, "sampling_seed": 1,
                                                                       "ignore_eos": True}, "return_logprob": True}])[0]
    engine_lp = torch.tensor([item[0] for item in out["meta_info"]["output_token_logprobs"]])
    sample = TrainSample(tokens=prompt + out["output_ids"], response_length=8, loss_mask=[1] * 8, reward=0.0)
    trainer_lp = backend._log_probs_no_grad(backend.model, build_rollout_tensors([sample]))[0]
    return float((engine_lp - trainer_lp).abs().mean())


def test_the_engine_holds_the_trainers_bf16_weights_and_agrees(tmp_path: Path) -> None:
    assert _engine_vs_trainer("cpu", tmp_path) < 0.05  # bf16 rounding of two different kernels
