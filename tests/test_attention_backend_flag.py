"""--attention-backend on the torch backend: the HF attention implementation each value builds, and the same log-probs
from every one of them; fused (Transformer Engine's kernel) refused with its reason. The Megatron backend's twin is
tests/megatron_rl_flag_checks.py's check_attention_backend_*."""

from __future__ import annotations

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.torch.backend import TorchTrainBackend
from relax.backends.torch.batch import TrainSample, build_rollout_tensors
from relax.models import build_model, hf_attention, load_tokenizer, save_hf
from relax.utils.arguments import ConfigError, parse_args

FLAGS = ["--preset", "quickstart", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
         "--global-batch-size", "32", "--micro-batch-size", "8", "--num-rollout", "1"]


def test_each_value_names_an_hf_attention_implementation() -> None:
    assert {v: hf_attention(v) for v in ("auto", "flash", "unfused", "local", None)} == {
        "auto": None, "flash": "sdpa", "unfused": "eager", "local": "eager", None: None}


def test_unfused_and_local_build_eager_attention_and_keep_the_log_probs(tmp_path) -> None:
    """An HF directory defaults to SDPA (auto); unfused / local build HF's eager attention in the policy and the
    reference, and the old log-probs of a batch agree with SDPA's to float32 rounding."""
    model_dir = save_hf(build_model("tiny-qwen3", seed=3), load_tokenizer("tiny-qwen3"), tmp_path / "hf")
    g = torch.Generator().manual_seed(0)
    samples = [TrainSample(tokens=torch.randint(3, 60, (int(n),), generator=g).tolist(), response_length=4,
                           loss_mask=[1] * 4, reward=0.0) for n in torch.randint(6, 12, (8,), generator=g)]
    batch = build_rollout_tensors(samples)
    lps = {}
    for value in ("auto", "unfused", "local"):
        args = parse_args([*FLAGS, "--hf-checkpoint", str(model_dir), "--attention-backend", value, "--use-kl-loss"])
        backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
        want = "sdpa" if value == "auto" else "eager"
        assert backend.model.config._attn_implementation == want  # noqa: SLF001 - transformers' own field
        assert backend.ref_model.config._attn_implementation == want  # noqa: SLF001
        lps[value] = backend._log_probs_no_grad(backend.model, batch)  # noqa: SLF001
    assert torch.equal(lps["unfused"], lps["local"])
    torch.testing.assert_close(lps["unfused"], lps["auto"], rtol=0, atol=1e-5)


def test_fused_is_refused_with_its_reason() -> None:
    """On a GPU run (--device cuda: parsing does not look for the device) the reason is Transformer Engine's."""
    with pytest.raises(ConfigError, match=r"^not supported yet: --attention-backend fused \(fused is Transformer "
                                          r"Engine's fused-attention kernel"):
        parse_args([*FLAGS, "--attention-backend", "fused", "--device", "cuda"])
    assert parse_args([*FLAGS, "--attention-backend", "unfused", "--device", "cpu"]).attention_backend == "unfused"
