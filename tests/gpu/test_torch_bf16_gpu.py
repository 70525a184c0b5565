"""``--bf16`` with the torch backend on a GPU: an HF directory trained in bf16 (SDPA attention, fp32 masters)
and the engine built the way engine actors build it (export dtype bf16, the GPU runner ``auto`` picks) agree
on the log-probs of the engine's own samples to bf16 rounding (on CPU they agree exactly:
tests/test_bf16_training.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_bf16_training import _engine_vs_trainer

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_bf16_trainer_and_engine_agree_on_gpu(tmp_path: Path) -> None:
    diff = _engine_vs_trainer("cuda", tmp_path)
    print(f"mean |engine - trainer| log-prob, bf16 on GPU: {diff:.2e}")
    assert diff < 0.05
