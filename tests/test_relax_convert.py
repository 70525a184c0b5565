"""``relax convert`` on CPU: HF -> Megatron-LM per-rank files (``--format torch``) -> HF, bitwise, at the file level.

The per-rank files are written from each rank's slices of the HF safetensors and read back by
gathering the pieces (relax/backends/megatron/legacy_format.py over sharding.py): the HF directory
that comes back holds every tensor of the original, bitwise, and loads in transformers. The
``torch_dist`` format runs megatron-core on one GPU per rank (tests/gpu/test_megatron_parallel_gpu.py);
here only its refusal without GPUs is checked.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers as tf
from safetensors import safe_open

from relax.cli import main as relax_main
from relax.entrypoints.convert import world_size
from relax.models import load_tokenizer


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    index = directory / "model.safetensors.index.json"
    files = sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else ["model.safetensors"]
    out = {}
    for name in files:
        with safe_open(str(directory / name), framework="pt") as f:
            out.update({k: f.get_tensor(k) for k in f.keys()})
    return out


def _hf_dir(tmp_path: Path, model) -> Path:
    path = tmp_path / "hf"
    model.save_pretrained(path)
    load_tokenizer("tiny-qwen3").save_pretrained(path)
    return path


MOE = tf.Qwen3MoeConfig(vocab_size=101, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=4,
                        num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2)
DENSE = tf.Qwen2Config(vocab_size=101, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                       num_key_value_heads=2, tie_word_embeddings=True)


@pytest.mark.parametrize("config, sizes", [
    (DENSE, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    (DENSE, ["--pipeline-model-parallel-size", "4"]),
    (MOE, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--expert-model-parallel-size", "2"]),
    (MOE, ["--expert-model-parallel-size", "4"]),
], ids=["qwen2-tp2-pp2", "qwen2-pp4", "moe-tp2-pp2-ep2", "moe-ep4"])
def test_hf_to_megatron_files_to_hf_is_bitwise(tmp_path: Path, config, sizes: list[str]) -> None:
    torch.manual_seed(0)
    model = (tf.Qwen3MoeForCausalLM if config.model_type == "qwen3_moe" else tf.Qwen2ForCausalLM)(config)
    hf = _hf_dir(tmp_path, model.to(torch.bfloat16))
    mcore, back = tmp_path / "mcore", tmp_path / "back"
    assert relax_main(["convert", "hf-to-megatron", "--hf-checkpoint", str(hf), "--output", str(mcore),
                       "--format", "torch", *sizes]) == 0
    ranks = sorted(p.name for p in (mcore / "release").iterdir())
    given = dict(zip(sizes[::2], map(int, sizes[1::2]), strict=True))
    expected = 1
    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--expert-model-parallel-size"):
        expected *= given.get(flag, 1)
    assert len(ranks) == expected, ranks
    assert (mcore / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert relax_main(["convert", "megatron-to-hf", "--load", str(mcore), "--output", str(back), "--format", "torch",
                       *sizes]) == 0
    original, converted = _tensors(hf), _tensors(back)
    assert set(converted) == set(original)
    for name, tensor in original.items():
        assert converted[name].dtype == tensor.dtype and torch.equal(converted[name], tensor), name
    reloaded = tf.AutoModelForCausalLM.from_pretrained(str(back), dtype=torch.bfloat16)
    assert all(torch.equal(reloaded.state_dict()[k], v) for k, v in model.state_dict().items())


def test_each_rank_file_holds_only_its_shard(tmp_path: Path) -> None:
    torch.manual_seed(0)
    hf = _hf_dir(tmp_path, tf.Qwen2ForCausalLM(DENSE))
    out = tmp_path / "mcore"
    assert relax_main(["convert", "hf-to-megatron", "--hf-checkpoint", str(hf), "--output", str(out), "--format",
                       "torch", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]) == 0
    first = torch.load(out / "release" / "mp_rank_01_000" / "model_optim_rng.pt", weights_only=True)["model"]
    last = torch.load(out / "release" / "mp_rank_00_001" / "model_optim_rng.pt", weights_only=True)["model"]
    assert first["embedding.word_embeddings.weight"].shape == (51, 32)  # 101 rows padded to 102, half each
    assert "output_layer.weight" in last and "embedding.word_embeddings.weight" not in last  # tied: last stage copy
    assert {k.split(".")[2] for k in last if k.startswith("decoder.layers.")} == {"0", "1"}  # global layers 2, 3
    assert first["decoder.layers.0.self_attention.linear_qkv.weight"].shape == (32, 32)  # 1 of 2 groups x (2+2) x 8


def test_convert_refusals_name_the_problem(tmp_path: Path, capsys) -> None:
    assert relax_main(["convert", "megatron-to-hf", "--load", str(tmp_path / "nope"), "--output", str(tmp_path / "o")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    (tmp_path / "ckpt").mkdir()
    assert relax_main(["convert", "megatron-to-hf", "--load", str(tmp_path / "ckpt"), "--output", str(tmp_path / "o")]) == 2
    assert "pass --hf-checkpoint" in capsys.readouterr().err
    if not torch.cuda.is_available():
        assert relax_main(["convert", "hf-to-megatron", "--hf-checkpoint", "tiny-qwen3", "--output",
                           str(tmp_path / "d"), "--tensor-model-parallel-size", "2"]) == 2
        assert "needs 2, found 0" in capsys.readouterr().err
    assert relax_main(["convert", "hf-to-megatron", "--hf-checkpoint", "tiny-qwen3", "--output", str(tmp_path / "t"),
                       "--format", "torch", "--tensor-model-parallel-size", "4"]) == 2
    assert "--tensor-model-parallel-size 4 must divide the model's 2 key/value heads" in capsys.readouterr().err
    assert world_size((2, 1, 4, 1)) == 4 and world_size((2, 2, 1, 1)) == 4 and world_size((4, 1, 2, 2)) == 4
