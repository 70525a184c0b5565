"""--offload-train on CUDA (torch backend): the offload frees at least the model, gradient and optimizer
bytes, puts every one of them on the CPU, and training after offload/onload round trips is bitwise
the same as training without them. Skipped with a reason without CUDA (the CPU twin, where the calls
are recorded no-ops, is tests/test_colocate_offload_e2e.py)."""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from tests.gpu.samples import varied_samples

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _backend():
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.utils.arguments import parse_args

    args = parse_args(["--train-backend", "torch", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "2", "--micro-batch-size", "2", "--lr", "3e-3"])
    return TorchTrainBackend(TrainerConfig.from_args(args), "cuda")


def _state_bytes(backend) -> tuple[int, int, int]:
    params = list(backend.model.parameters())
    model = sum(p.nbytes for p in params) + sum(b.nbytes for b in backend.model.buffers())
    grads = sum(p.grad.nbytes for p in params if p.grad is not None)
    optim = sum(v.nbytes for s in backend.optimizer.state.values() for v in s.values()
                if isinstance(v, torch.Tensor) and v.is_cuda)
    return model, grads, optim


def _tensors(backend):
    for p in backend.model.parameters():
        yield p
        if p.grad is not None:
            yield p.grad
    yield from backend.model.buffers()
    for s in backend.optimizer.state.values():
        yield from (v for v in s.values() if isinstance(v, torch.Tensor))


def test_offload_frees_model_grads_and_optimizer_state() -> None:
    backend = _backend()
    backend.train_rollout(varied_samples(0), 0)  # creates grads and Adam state
    model, grads, optim = _state_bytes(backend)
    assert grads > 0 and optim >= 2 * grads  # exp_avg + exp_avg_sq per trained parameter
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    stats = backend.offload()
    assert torch.cuda.memory_allocated() <= before - (model + grads + optim)
    assert stats["device_bytes"] >= model + grads + optim
    assert stats["moved_bytes"] >= model + grads + optim and stats["seconds"] > 0
    assert all(t.device.type == "cpu" for t in _tensors(backend))
    back = backend.onload()
    assert back["device_bytes"] >= model + grads + optim
    assert all(p.is_cuda and (p.grad is None or p.grad.is_cuda) for p in backend.model.parameters())
    assert all(v.is_cuda for s in backend.optimizer.state.values() for k, v in s.items() if k != "step")
    with pytest.raises(RuntimeError, match="not offloaded"):
        backend.onload()


def test_training_with_offload_round_trips_is_bitwise_equal() -> None:
    plain, offloaded = _backend(), _backend()
    assert all(torch.equal(a, b) for a, b in zip(plain.model.state_dict().values(),
                                                  offloaded.model.state_dict().values(), strict=True))
    offloaded.offload()  # parked before the first rollout, as the colocate loop does
    for step in range(2):
        m_plain = plain.train_rollout(varied_samples(step), step)
        offloaded.onload()
        m_off = offloaded.train_rollout(varied_samples(step), step)
        offloaded.offload()
        for key in ("train/loss", "train/pg_loss", "train/grad_norm", "train/ppo_kl"):
            assert m_plain[key] == m_off[key], f"step {step} {key}: {m_plain[key]} vs {m_off[key]}"
    assert plain.checksums() == offloaded.checksums()  # read from the CPU copies: the sync path
    offloaded.onload()
    for (name, a), b in zip(plain.model.state_dict().items(), offloaded.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    for p, q in zip(plain.model.parameters(), offloaded.model.parameters(), strict=True):
        sp, sq = plain.optimizer.state[p], offloaded.optimizer.state[q]
        assert all(torch.equal(sp[k].cpu(), sq[k].cpu()) for k in sp)
