"""Parse-time rules of the Megatron parallel flags (CPU, no megatron-core needed: parsing as on the GPU machine).

Each flag among --tensor/--pipeline/--context/--expert/--expert-tensor-parallel-size,
--sequence-parallel and --qkv-format is either accepted for a layout that fits the trainer's ranks
and the model, or refused in one line naming the flag and what is missing.
"""

from __future__ import annotations

import pytest
import transformers as tf

from relax.utils.arguments import parse_args
from relax.utils.flag_types import ConfigError
from tests.e2e_helpers import pretend_gpu_machine

BASE = ["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1", "--train-backend", "megatron",
        "--device", "cuda"]


def _ranks(n: int) -> list[str]:
    return ["--resource", f'{{"actor": [1, {n}]}}']  # one replica of n GPUs: n trainer ranks


@pytest.fixture
def gpu(monkeypatch):
    pretend_gpu_machine(monkeypatch)


@pytest.fixture(scope="module")
def moe_dir(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("moe")
    tf.Qwen3MoeConfig(vocab_size=64, hidden_size=32, moe_intermediate_size=16, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=8, num_experts=4,
                      num_experts_per_tok=2).save_pretrained(path)
    return str(path)


@pytest.mark.parametrize("flags, ranks", [
    ([], 2),  # data parallelism over 2 ranks
    (["--tensor-model-parallel-size", "2"], 2),
    (["--tensor-model-parallel-size", "2", "--sequence-parallel"], 4),  # TP 2 x DP 2
    (["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"], 4),
    (["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"], 4),
    (["--qkv-format", "bshd"], 1),
])
def test_layouts_that_fit_are_accepted(gpu, flags: list[str], ranks: int) -> None:
    args = parse_args([*BASE, "--hf-checkpoint", "tiny-qwen3", *_ranks(ranks), *flags])
    assert args.qkv_format == "bshd"  # the seed's default thd resolves to what relax builds


@pytest.mark.parametrize("flags, ranks, message", [
    (["--tensor-model-parallel-size", "2"], 1,
     r"^the trainer's 1 rank\(s\) \(--resource actor\) are not divisible by tensor x context x pipeline parallel "
     r"= 2 x 1 x 1 = 2$"),
    (["--pipeline-model-parallel-size", "2"], 3, r"not divisible by tensor x context x pipeline parallel"),
    (["--tensor-model-parallel-size", "4"], 4, r"^--tensor-model-parallel-size 4 must divide the model's 2 key/value "),
    (["--pipeline-model-parallel-size", "4"], 4, r"^--pipeline-model-parallel-size 4 must divide the model's 2 layers$"),
    (["--context-parallel-size", "2"], 2,
     r"^not supported yet: --context-parallel-size 2 \(megatron-core runs context parallelism only in Transformer "
     r"Engine's attention"),
    (["--sequence-parallel"], 2, r"^--sequence-parallel needs --tensor-model-parallel-size > 1"),
    (["--expert-model-parallel-size", "2"], 2, r"^--expert-model-parallel-size 2 needs a MoE model; qwen3 is dense$"),
    (["--expert-tensor-parallel-size", "2"], 2, r"^--expert-tensor-parallel-size 2 needs a MoE model"),
    (["--tensor-model-parallel-size", "0"], 1, r"^--tensor-model-parallel-size must be >= 1, got 0$"),
    (["--qkv-format", "thd"], 1, r"^not supported yet: --qkv-format thd \(packed sequences: megatron-core runs "
                                 r"packed_seq_params only in Transformer Engine's attention"),
])
def test_layouts_that_do_not_fit_are_refused_in_one_line(gpu, flags: list[str], ranks: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        parse_args([*BASE, "--hf-checkpoint", "tiny-qwen3", *_ranks(ranks), *flags])
    assert "\n" not in str(info.value)


def test_moe_rules(gpu, moe_dir: str) -> None:
    ok = parse_args([*BASE, "--hf-checkpoint", moe_dir, *_ranks(4), "--expert-model-parallel-size", "4"])
    assert ok.expert_model_parallel_size == 4
    parse_args([*BASE, "--hf-checkpoint", moe_dir, *_ranks(2), "--expert-tensor-parallel-size", "2"])
    with pytest.raises(ConfigError, match=r"^--expert-model-parallel-size 3 must divide the model's 4 experts$"):
        parse_args([*BASE, "--hf-checkpoint", moe_dir, *_ranks(3), "--expert-model-parallel-size", "3"])
    with pytest.raises(ConfigError, match=r"needs --sequence-parallel \(megatron-core's rule for expert parallelism\)"):
        parse_args([*BASE, "--hf-checkpoint", moe_dir, *_ranks(4), "--expert-model-parallel-size", "2",
                    "--tensor-model-parallel-size", "2"])
    with pytest.raises(ConfigError, match=r"a MoE model with --tensor-model-parallel-size > 1 needs --sequence-parallel"):
        parse_args([*BASE, "--hf-checkpoint", moe_dir, *_ranks(2), "--tensor-model-parallel-size", "2"])
    with pytest.raises(ConfigError, match=r"not divisible by expert tensor x expert x pipeline parallel = 2 x 2 x 1"):
        parse_args([*BASE, "--hf-checkpoint", moe_dir, *_ranks(2), "--expert-model-parallel-size", "2",
                    "--expert-tensor-parallel-size", "2"])


@pytest.mark.parametrize("flag", ["--tensor-model-parallel-size", "--pipeline-model-parallel-size",
                                  "--expert-model-parallel-size", "--sequence-parallel"])
def test_parallel_flags_need_the_megatron_backend(flag: str) -> None:
    value = [] if flag == "--sequence-parallel" else ["2"]
    with pytest.raises(ConfigError, match=rf"^{flag}( 2)? needs --train-backend megatron"):
        parse_args(["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1", *_ranks(2),
                    "--train-backend", "torch",
                    flag, *value])
