"""The Megatron backend with a model described by seed 001's architecture flags and no HF config.

A tokenizer-only ``--hf-checkpoint`` directory plus ``scripts/models/tiny-qwen3.sh``: setup builds the
model from the flags (relax/models/arch_flags.py), and the Megatron backend trains it; its
``McoreModelSpec`` equals ``spec_from_flags`` of the same flags, ``--bf16`` is implied and the backend
exports bf16 (what the engines hold).
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available
from relax.models.arch_flags import ModelArchConfig

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]
REPO = Path(__file__).resolve().parents[2]


def _model_args() -> list[str]:
    out = subprocess.run(["bash", "-c", f'source {REPO}/scripts/models/tiny-qwen3.sh; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_megatron_trains_a_model_built_from_flags(tmp_path: Path) -> None:
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.core.setup import prepare_model
    from relax.models import load_tokenizer
    from relax.models.arch_flags import spec_from_flags
    from relax.utils.arguments import parse_args
    from relax.utils.flag_types import Problems
    from tests.gpu.test_megatron_gpu import _random_samples

    load_tokenizer("tiny-qwen3").save_pretrained(tmp_path / "tok")
    args = parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", str(tmp_path / "tok"),
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", "2", "--lr", "3e-3", "--output-dir",
                       str(tmp_path / "run"), *_model_args()])
    assert args.bf16 is True  # implied by the Megatron backend
    p = Problems()
    prepare_model(args, p)
    assert not p, p.lines
    backend = MegatronTrainBackend(TrainerConfig.from_args(args), "cuda")
    assert backend.spec == spec_from_flags(ModelArchConfig.from_args(args), pad_token_id=0, eos_token_id=2, vocab_from_tokenizer=100)
    samples = _random_samples(8, 100, seed=3)
    for s in samples:
        s.tokens = [t % 100 for t in s.tokens]
    metrics = [backend.train_rollout(samples, step) for step in range(2)]
    assert all(torch.isfinite(torch.tensor(m["train/grad_norm"])) for m in metrics)
    assert {t.dtype for _, t in backend.device_named_tensors()} == {torch.bfloat16}
