"""--custom-model-provider-path with --train-backend megatron on CUDA (relax/models/provider.py): a Megatron-LM
``model_provider(pre_process, post_process, vp_stage, config)`` builds the trainer's GPTModel, relax loads
--hf-checkpoint's weights into it and the engine receives them bitwise. The CPU checks of the hook's loading,
signature and return type: tests/test_model_provider.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.e2e_helpers import assert_ok, read_jsonl, run_relax

pytestmark = [pytest.mark.gpu, pytest.mark.megatron,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_a_megatron_provider_builds_the_trained_model_and_its_weights_reach_the_engine(tmp_path: Path) -> None:
    log = tmp_path / "provider.log"
    run = tmp_path / "run"
    assert_ok(run_relax(["--preset", "quickstart", "--device", "cuda", "--train-backend", "megatron",
                         "--hf-checkpoint", "small-qwen3", "--rollout-batch-size", "8", "--n-samples-per-prompt", "4",
                         "--global-batch-size", "32", "--micro-batch-size", "16", "--num-rollout", "2",
                         "--custom-model-provider-path", "tests.model_providers.megatron_gpt",
                         "--train-env-vars", json.dumps({"RELAX_TEST_PROVIDER_LOG": str(log)}),
                         "--output-dir", str(run)], tmp_path, timeout=900))
    builds = log.read_text().splitlines()
    assert builds and set(builds) == {"pre_process=True post_process=True vp_stage=None"}
    records = read_jsonl(run / "weights.jsonl")
    versions = sorted({r["version"] for r in records})
    assert len(versions) == 3
    for version in versions:
        sides = {r["side"]: r["checksums"] for r in records if r["version"] == version}
        assert sides["trainer"] == sides["engine:0"], version
