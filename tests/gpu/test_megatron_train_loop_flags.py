"""The shared training-loop flags on the Megatron backend (one GPU, bf16).

Freezing matches megatron-core names and leaves the frozen weights (as exported under HF names)
bitwise unchanged; chunked log-probs equal unchunked; dynamic batching keeps step-0 ppo_kl at 0.
Skipped with a reason without CUDA or megatron-core (the CPU twins are tests/test_train_loop_flags.py).
"""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available
from tests.gpu.samples import varied_samples

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]


def _args(*extra: str):
    from relax.utils.arguments import parse_args

    return parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", "2", "--lr", "3e-3", *extra])


def test_freezing_megatron_names_keeps_exported_weights_bitwise(mcore) -> None:
    from relax.backends.megatron.backend import MegatronTrainBackend

    backend = MegatronTrainBackend(TrainerConfig.from_args(_args("--freeze-params-name-list", "embedding", r"decoder\.layers\.0\.")), "cuda")
    assert backend.frozen_params and all("embedding" in n or "layers.0." in n for n in backend.frozen_params)
    before = {k: v.clone() for k, v in backend.hf_state().items()}
    for step in range(2):
        backend.train_rollout(varied_samples(seed=step), step)
    after = backend.hf_state()
    frozen = [k for k in before if "embed_tokens" in k or "lm_head" in k or ".layers.0." in k]
    assert frozen
    for k in frozen:
        assert torch.equal(before[k], after[k]), f"frozen {k} changed"
    assert any(not torch.equal(before[k], after[k]) for k in before if k not in frozen)


def test_unknown_megatron_name_pattern_is_an_error(mcore) -> None:
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.utils.flag_types import ConfigError

    with pytest.raises(ConfigError, match="embed_tokens"):  # an HF name: this backend matches megatron names
        MegatronTrainBackend(TrainerConfig.from_args(_args("--only-train-params-name-list", "embed_tokens")), "cuda")


def test_chunked_log_probs_equal_unchunked_and_dynamic_batching_trains(mcore) -> None:
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.backends.torch.batch import build_rollout_tensors

    backend = MegatronTrainBackend(TrainerConfig.from_args(_args("--use-dynamic-batch-size", "--max-tokens-per-gpu", "48")), "cuda")
    batch = build_rollout_tensors(varied_samples(seed=5))
    plain = backend._log_probs_no_grad(backend.model, batch)
    backend.cfg = backend.cfg.replace(log_probs_chunk_size=7)
    chunked = backend._log_probs_no_grad(backend.model, batch)
    assert torch.equal(plain, chunked)
    assert len(backend._all_micro_batches(batch.samples)) > 4  # not the fixed 2-sample split
    metrics = backend.train_rollout(varied_samples(seed=5), 0)
    assert abs(metrics["train/ppo_kl"]) < 1e-6 and torch.isfinite(torch.tensor(metrics["train/grad_norm"]))
