"""--train-memory-margin-bytes: a CUDA trainer rank stops before a step it has too little memory for."""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch import memory_margin
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.memory_margin import MemoryMarginError, check_margin
from relax.utils.flag_types import GiB, MiB
from tests.test_train_loop_flags import _args, _samples

CUDA = torch.device("cuda", 0)


@pytest.mark.parametrize(("text", "want"), [("1GB", GiB), ("512MB", 512 * MiB), ("0", 0), ("1048576", MiB)])
def test_sizes_parse(text: str, want: int) -> None:
    assert _args("--train-memory-margin-bytes", text).train_memory_margin_bytes == want


def test_default_is_one_gib() -> None:
    assert _args().train_memory_margin_bytes == GiB


def test_the_check_with_a_fake_reading() -> None:
    assert check_margin(GiB, CUDA, 3, reading=lambda d: 2 * GiB) == 2 * GiB
    with pytest.raises(MemoryMarginError, match=r"^--train-memory-margin-bytes 1GB: only 512MB of cuda:0 memory "
                                                r"is available when step 3's training starts"):
        check_margin(GiB, CUDA, 3, reading=lambda d: 512 * MiB)
    assert check_margin(0, CUDA, 3, reading=lambda d: 0) is None  # 0: no check
    assert check_margin(GiB, torch.device("cpu"), 3) is None  # nothing to read on CPU


def test_the_backend_checks_before_each_step(monkeypatch) -> None:
    readings: list[torch.device] = []

    def low(device):
        readings.append(device)
        return 256 * MiB

    monkeypatch.setattr(memory_margin.check_margin, "__defaults__", (low,))
    backend = TorchTrainBackend(TrainerConfig.from_args(_args("--train-memory-margin-bytes", "300MB")), "cpu")
    before = [p.clone() for p in backend.model.parameters()]
    with pytest.raises(MemoryMarginError, match="only 256MB of cpu memory"):
        backend.train_rollout(_samples(seed=1), 0)
    assert readings == [torch.device("cpu")]
    assert all(torch.equal(p, q) for p, q in zip(before, backend.model.parameters(), strict=True))  # nothing trained
    ok = TorchTrainBackend(TrainerConfig.from_args(_args("--train-memory-margin-bytes", "200MB")), "cpu")
    ok.train_rollout(_samples(seed=1), 0)
    assert len(readings) == 2
