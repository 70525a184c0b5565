"""--custom-model-provider-path (relax/models/provider.py): the torch trainer's policy is what the user's function
builds for the checkpoint's config (its marker is in the trainer's weights, and a run syncs those weights to the
engine bitwise); a path that does not import, a wrong signature, a wrong return type, other parameter names or
shapes are each one line at launch naming the path; the Megatron hook's signature and return type checks run on
the CPU (building a GPTModel needs a GPU)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from relax.models import provider
from relax.utils.plugins import PluginError
from tests import model_providers
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

P = "tests.model_providers."
REPO = Path(__file__).resolve().parents[1]


def test_the_torch_trainer_trains_the_providers_model() -> None:
    from relax.backends.config import TrainerConfig
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.utils.arguments import parse_args
    from tests.test_train_loop_flags import BASE

    plain = TorchTrainBackend(TrainerConfig.from_args(parse_args(BASE)), "cpu")
    backend = TorchTrainBackend(TrainerConfig.from_args(
        parse_args([*BASE, "--custom-model-provider-path", P + "marked", "--kl-loss-coef", "0.1", "--use-kl-loss"])),
        "cpu")
    assert backend.model.built_by_provider and backend.ref_model.built_by_provider  # the reference is its copy
    mine, theirs = backend.model.state_dict(), plain.model.state_dict()
    assert torch.equal(mine["model.norm.weight"], torch.full_like(theirs["model.norm.weight"], model_providers.MARK))
    assert not torch.equal(theirs["model.norm.weight"], mine["model.norm.weight"])
    # the rest is the seeded init relax gives the preset: --seed is in force while the provider builds
    assert all(torch.equal(mine[k], theirs[k]) for k in theirs if k != "model.norm.weight")


def test_a_directory_checkpoints_weights_are_loaded_into_the_providers_model(tmp_path: Path) -> None:
    from relax.models import build_model, load_tokenizer, save_hf

    saved = build_model("tiny-qwen3", seed=11)
    save_hf(saved, load_tokenizer("tiny-qwen3"), tmp_path / "ckpt")
    model = provider.build_provided_model(P + "marked", str(tmp_path / "ckpt"), dtype=torch.float32, seed=0)
    assert model.built_by_provider
    assert all(torch.equal(v, saved.state_dict()[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize(("path", "expected"), [
    ("tests.no_such_module.marked", "--custom-model-provider-path: cannot import module 'tests.no_such_module'"),
    (P + "no_arguments", "takes 0 positional argument(s), expected provider(config"),
    (P + "not_a_module", f"--custom-model-provider-path {P}not_a_module: returned dict, not a torch.nn.Module"),
    (P + "renamed", f"--custom-model-provider-path {P}renamed: its model's parameter names differ from "
                    "--hf-checkpoint tiny-qwen3's (missing ['lm_head.weight'"),
    (P + "wider", f"--custom-model-provider-path {P}wider: parameter shapes differ from --hf-checkpoint tiny-qwen3's: "
                  "model.layers.0.mlp.down_proj.weight [64, 129] (checkpoint [64, 128])"),
])
def test_a_bad_torch_provider_is_one_line_at_launch(path: str, expected: str) -> None:
    with pytest.raises(PluginError) as err:
        provider.check_at_launch(path, "torch", "tiny-qwen3")
    assert expected in str(err.value) and "\n" not in str(err.value)


def test_save_hf_needs_a_model_transformers_can_save() -> None:
    provider.check_at_launch(P + "bare", "torch", "tiny-qwen3")  # the names are the checkpoint's
    with pytest.raises(PluginError, match=f"{P}bare: --save-hf writes the model with transformers' save_pretrained"):
        provider.check_at_launch(P + "bare", "torch", "tiny-qwen3", save_hf=True)


def test_the_megatron_hook_takes_megatron_lms_signature_and_a_gptmodel() -> None:
    fn = provider.load_provider(P + "megatron_provider", "megatron")
    assert provider.megatron_kwargs(fn, pre_process=True, post_process=False, vp_stage=None, config="cfg") == {
        "pre_process": True, "post_process": False, "vp_stage": None}  # it takes no config: none is passed
    with pytest.raises(PluginError, match=r"takes \(config\), not pre_process and post_process"):
        provider.check_at_launch(P + "megatron_without_stages", "megatron", "tiny-qwen3")


def test_the_megatron_hook_refuses_what_is_not_a_gptmodel() -> None:
    pytest.importorskip("megatron.core", reason="megatron-core is not installed")
    with pytest.raises(PluginError, match="returned Linear, not a megatron-core GPTModel"):
        provider.call_megatron_provider(P + "megatron_provider", pre_process=True, post_process=True, config=None)


def test_relax_train_refuses_a_bad_provider_in_one_line(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the providers live in tests/, run from tmp_path
    proc = run_relax([*FAST_FLAGS, "--custom-model-provider-path", P + "not_a_module",
                      "--output-dir", str(tmp_path / "o")], tmp_path)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and f"--custom-model-provider-path {P}not_a_module: returned dict" in lines[0], proc.stderr


def test_a_run_trains_the_providers_model_and_syncs_it_to_the_engine(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(REPO))  # the trainer actor imports the provider from tests/
    run = tmp_path / "run"
    # a private cluster: its workers inherit the driver's PYTHONPATH (the shared one's were started without it)
    assert_ok(run_relax([*FAST_FLAGS, "--num-rollout", "1", "--custom-model-provider-path", P + "marked",
                         "--output-dir", str(run)], tmp_path, private_cluster=True))
    records = read_jsonl(run / "weights.jsonl")
    first = {r["side"]: r["checksums"] for r in records if r["version"] == min(x["version"] for x in records)}
    assert first["trainer"] == first["engine:0"]  # the engine loaded every synced tensor by name
    from relax.weights.checksum import state_checksums

    norm = torch.full((64,), model_providers.MARK)  # tiny-qwen3's hidden size; what no preset init gives
    assert first["trainer"]["model.norm.weight"] == state_checksums([("model.norm.weight", norm)])["model.norm.weight"]
