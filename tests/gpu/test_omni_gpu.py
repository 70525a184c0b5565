"""The audio modality on CUDA: the tiny omni model's two steps on high/low tones (tests/test_multimodal_audio.py's
CPU run) with the trainer and the embedded engine's audio tower on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.test_multimodal_audio import train_omni_on_tones

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_the_omni_model_trains_on_audio_on_the_gpu_and_syncs_every_tensor(tmp_path: Path) -> None:
    train_omni_on_tones(tmp_path, "cuda")
