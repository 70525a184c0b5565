"""Porting a launch script takes one run: every problem of the flags, the config files and the cross-flag rules
is reported at once, one line each; the seeds' model and misc flags are accepted and checked."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.models.arch_flags import ModelArchConfig
from relax.utils.arguments import ConfigError, parse_args
from relax.utils.flag_types import ConfigErrors

BASE = ["--preset", "quickstart"]
REPO = Path(__file__).resolve().parents[1]


def _problems(argv: list[str]) -> list[str]:
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    return info.value.problems


# ---------------------------------------------------------------------- all at once
def test_every_unknown_flag_and_bad_value_in_one_error() -> None:
    problems = _problems([*BASE, "--rollout-batchsize", "3", "--lr", "fast", "--zzzz", "--kl-loss-type", "k9",
                          "--n-sample-per-prompt", "2"])
    assert problems[:3] + problems[4:] == [
        "unknown flag --rollout-batchsize (did you mean --rollout-batch-size?)",
        "argument --lr: expected a number, got 'fast'",
        "unknown flag --zzzz",
        "unknown flag --n-sample-per-prompt (did you mean --n-samples-per-prompt?)",
    ]
    assert problems[3].startswith("argument --kl-loss-type: invalid choice: 'k9' (choose from ")  # argparse's wording


def test_every_config_file_problem_in_one_error(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lrr: 1\nlr: fast\nkl_loss_type: k9\nrollout_batch_size: 4\n")
    problems = _problems([*BASE, "--config", str(cfg), "--unknown-x"])
    assert problems == ["unknown flag --unknown-x", f"--config: {cfg}: unknown key 'lrr'",
                        f"--config: {cfg}: key 'lr': expected a number, got 'fast'",
                        f"--config: {cfg}: key 'kl_loss_type': 'k9' is not one of k1, k2, k3, low_var_kl"]


def test_every_broken_rule_in_one_error() -> None:
    problems = _problems([*BASE, "--global-batch-size", "100", "--kl-coef", "0.1", "--kl-loss-coef", "0.1",
                          "--loss-type", "custom_loss", "--num-data-storage-units", "2", "--allgather-cp"])
    assert problems == [
        "not supported yet: --allgather-cp (context parallelism: megatron-core runs it only in Transformer Engine's "
        "attention, and no transformer-engine build is installed on our machines)",
        "--global-batch-size 100 must divide rollout-batch-size x n-samples-per-prompt = 32 x 8 = 256",
        "--kl-coef 0.1 and --kl-loss-coef 0.1 are mutually exclusive (reward shaping vs loss term): set one of them to 0",
        "--loss-type custom_loss requires --custom-loss-function-path",
        "--num-data-storage-units has no effect without --fully-async (the colocate loop hands samples to the "
        "trainer directly)",
    ]


def test_the_cli_prints_one_line_per_problem(capsys) -> None:
    from relax.entrypoints.train import main

    assert main([*BASE, "--zzzz", "--yyyy", "--global-batch-size", "7"]) == 2
    assert capsys.readouterr().err.splitlines() == ["relax: unknown flag --zzzz", "relax: unknown flag --yyyy"]
    assert isinstance(ConfigErrors(["a", "b"]), ConfigError)


def test_nan_is_no_value_of_a_float_flag(tmp_path: Path) -> None:
    """NaN passes every range check (each comparison is False): --lr nan reached the optimizer before this."""
    assert _problems([*BASE, "--lr", "nan", "--rollout-temperature", "NaN"]) == [
        "argument --lr: expected a number, got 'nan' (not a number)",
        "argument --rollout-temperature: expected a number, got 'NaN' (not a number)"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("kl_loss_coef: .nan\n")
    assert _problems([*BASE, "--config", str(cfg)]) == [
        f"--config: {cfg}: key 'kl_loss_coef': expected a number, got nan (not a number)"]
    assert parse_args([*BASE, "--clip-grad", "inf"]).clip_grad == float("inf")  # no clipping: a value, kept


# ---------------------------------------------------------------------- seed 004's flags
def test_custom_config_path_sets_recipe_keys_and_validates_flag_keys(tmp_path: Path) -> None:
    cfg = tmp_path / "algo_config.yaml"
    cfg.write_text("max_turns: 5\nrollout_interaction_env_path: examples.arith_env.env_arith\n"
                   "judge_url: http://localhost:8000/v1\nrollout_batch_size: 4\nglobal-batch-size: 32\nmicro_batch_size: 8\n")
    args = parse_args([*BASE, "--custom-config-path", str(cfg)])
    assert args.max_turns == 5 and args.judge_url == "http://localhost:8000/v1"
    assert args.rollout_interaction_env_path == "examples.arith_env.env_arith"
    assert args.rollout_batch_size == 4 and args.global_batch_size == 32  # keys naming flags are those flags
    assert args.notices == [f"--custom-config-path {cfg}: keys that are no flag, set on args as recipe settings: "
                            "max_turns, rollout_interaction_env_path, judge_url"]  # said at start: a typo lands there
    cfg.write_text("rollout_batch_sizes: 4\n")
    assert parse_args([*BASE, "--custom-config-path", str(cfg)]).notices == [
        f"--custom-config-path {cfg}: keys that are no flag, set on args as recipe settings: "
        "rollout_batch_sizes (is it --rollout-batch-size?)"]
    cfg.write_text("max_turns: 5\nlr: fast\nmicro_batch_size: 0\n")
    assert _problems([*BASE, "--custom-config-path", str(cfg)]) == [
        f"--custom-config-path: {cfg}: key 'lr': expected a number, got 'fast'"]
    cfg.write_text("max_turns: 5\n")
    assert _problems([*BASE, "--config", str(cfg)]) == [f"--config: {cfg}: unknown key 'max_turns'"]
    cfg.write_text("notices: [x]\n")
    assert _problems([*BASE, "--custom-config-path", str(cfg)]) == [
        f"--custom-config-path: {cfg}: key 'notices' names an attribute relax sets itself; rename it"]


def test_prompt_data_takes_a_list_of_files(tmp_path: Path) -> None:
    from relax.data.dataset import prompt_files

    assert prompt_files("a.jsonl") == ["a.jsonl"]
    assert prompt_files("['/d/a.parquet', '/d/b.parquet']") == ["/d/a.parquet", "/d/b.parquet"]
    assert prompt_files('["a.jsonl"]') == ["a.jsonl"]
    assert _problems([*BASE, "--prompt-data", "['a.jsonl',"]) == [
        "--prompt-data \"['a.jsonl',\" is not a list of paths (write ['a.jsonl', 'b.parquet'], or a single path)"]
    cfg = tmp_path / "c.yaml"
    cfg.write_text("prompt_data: [a.jsonl, b.jsonl]\n")
    assert prompt_files(parse_args([*BASE, "--config", str(cfg)]).prompt_data) == ["a.jsonl", "b.jsonl"]


def test_prompt_files_are_read_in_order(tmp_path: Path) -> None:
    from relax.engine.rollout.data_source import RolloutDataSourceWithBuffer
    from relax.models import load_tokenizer

    (tmp_path / "a.jsonl").write_text('{"prompt": "1+1=", "label": "2"}\n')
    (tmp_path / "b.jsonl").write_text('{"prompt": "2+2=", "label": "4"}\n{"prompt": "3+3=", "label": "6"}\n')
    args = parse_args([*BASE, "--prompt-data", str([str(tmp_path / "a.jsonl"), str(tmp_path / "b.jsonl")])])
    source = RolloutDataSourceWithBuffer(args, tokenizer=load_tokenizer("tiny-qwen3"))
    assert [s.label for s in source.prompts] == ["2", "4", "6"] and [s.group_index for s in source.prompts] == [0, 1, 2]


def test_ref_load_naming_the_hf_checkpoint_is_accepted(tmp_path: Path) -> None:
    args = parse_args([*BASE, "--hf-checkpoint", str(tmp_path), "--ref-load", f"{tmp_path}/"])
    assert args.ref_load == f"{tmp_path}/"
    assert _problems([*BASE, "--ref-load", str(tmp_path)]) == [  # another HF directory: it must hold a model
        f"--ref-load {tmp_path}: no config.json", f"--ref-load {tmp_path}: no *.safetensors weights"]
    assert parse_args([*BASE, "--ref-load", "tiny-llama"]).ref_load == "tiny-llama"  # another model (a preset)


def test_max_tokens_per_gpu_without_dynamic_batching_budgets_the_log_prob_passes() -> None:
    """Seed 004 passes --micro-batch-size 1 --max-tokens-per-gpu 9216: training takes one sample per micro-batch,
    the no-grad log-prob passes pack samples up to the budget."""
    from relax.backends.torch.backend import TorchTrainBackend
    from relax.backends.torch.batch import TrainSample

    args = parse_args([*BASE, "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--micro-batch-size", "1",
                       "--max-tokens-per-gpu", "20"])
    assert args.log_probs_max_tokens_per_gpu == 20 and not args.use_dynamic_batch_size
    backend = TorchTrainBackend(TrainerConfig.from_args(args), "cpu")
    samples = [TrainSample(tokens=[1] * 5, response_length=1, loss_mask=[1], reward=0.0) for _ in range(8)]
    assert len(backend._micro_batches(samples, slice(0, 8))) == 8
    assert backend._micro_batches(samples, slice(0, 8), log_probs=True) == [slice(0, 4), slice(4, 8)]


# ---------------------------------------------------------------------- model-architecture flags
def _model_args(script: str) -> list[str]:
    out = subprocess.run(["bash", "-c", f'source {script}; printf "%s\\n" "${{MODEL_ARGS[@]}}"'],
                         capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


# published parameter counts (billions) of the architectures scripts/models/ describes
PUBLISHED = {"qwen2.5-0.5B": 0.494, "qwen2.5-1.5B": 1.544, "qwen2.5-7B": 7.616, "qwen3-0.6B": 0.596,
             "qwen3-4B": 4.022, "qwen3-8B": 8.191, "llama3-8B": 8.030, "llama2-7B": 6.738, "tinyllama-1.1B": 1.100,
             "tiny-qwen3": 0.0000805}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_shipped_model_scripts_parse_and_build_the_published_architecture(name: str) -> None:
    import transformers as tf

    from relax.models.arch_flags import config_from_flags, spec_from_flags

    args = parse_args([*BASE, *_model_args(str(REPO / "scripts/models" / f"{name}.sh")), "--seq-length", "4096"])
    config = config_from_flags(ModelArchConfig.from_args(args), pad_token_id=0, eos_token_id=1, vocab_from_tokenizer=0)
    with torch.device("meta"):
        model = tf.AutoModelForCausalLM.from_config(config)
    assert sum(p.numel() for p in model.parameters()) / 1e9 == pytest.approx(PUBLISHED[name], rel=2e-3)
    spec = spec_from_flags(ModelArchConfig.from_args(args))  # what the Megatron backend builds from the same flags
    assert (spec.num_layers, spec.hidden_size, spec.vocab_size) == (config.num_hidden_layers, config.hidden_size,
                                                                   config.vocab_size)
    assert spec.qk_layernorm == name.startswith(("qwen3", "tiny-qwen3")) and spec.add_qkv_bias == name.startswith("qwen2")


def test_model_flags_matching_the_checkpoint_pass_and_mismatches_name_both_values(tmp_path: Path) -> None:
    from relax.core.setup import prepare_model
    from relax.utils.flag_types import Problems

    flags = _model_args(str(REPO / "scripts/models/tiny-qwen3.sh"))
    p = Problems()
    prepare_model(parse_args([*BASE, *flags, "--output-dir", str(tmp_path)]), p)
    assert not p, p.lines
    wrong = [f for f in flags if f != "--qk-layernorm"]
    wrong[wrong.index("--hidden-size") + 1] = "128"
    wrong[wrong.index("--rotary-base") + 1] = "1000000"
    prepare_model(parse_args([*BASE, *wrong, "--untie-embeddings-and-output-weights", "--output-dir", str(tmp_path)]),
                  p)
    assert p.lines == [
        "--hidden-size 128 does not match hidden_size=64 in preset 'tiny-qwen3'",
        "--rotary-base 1000000.0 does not match rope_theta=10000.0 in preset 'tiny-qwen3'",
        "--untie-embeddings-and-output-weights does not match preset 'tiny-qwen3': tie_word_embeddings=True",
        "no --qk-layernorm does not match preset 'tiny-qwen3': model_type='qwen3' (q/k norms: True)",
    ]


def test_a_tokenizer_only_directory_gets_its_model_from_the_flags(tmp_path: Path) -> None:
    from transformers import AutoModelForCausalLM

    from relax.core.setup import prepare_model
    from relax.models import load_tokenizer
    from relax.utils.flag_types import Problems

    tok_dir = tmp_path / "tok"
    load_tokenizer("tiny-qwen3").save_pretrained(tok_dir)
    args = parse_args([*BASE, "--hf-checkpoint", str(tok_dir), *_model_args(str(REPO / "scripts/models/tiny-qwen3.sh")),
                       "--output-dir", str(tmp_path / "run")])
    p = Problems()
    prepare_model(args, p)
    assert not p, p.lines
    assert args.hf_checkpoint == str(tmp_path / "run" / "model_from_flags") and "has no config.json" in args.notices[-1]
    model = AutoModelForCausalLM.from_pretrained(args.hf_checkpoint)
    assert model.config.model_type == "qwen3" and sum(x.numel() for x in model.parameters()) == 80512
    args = parse_args([*BASE, "--hf-checkpoint", str(tok_dir), "--output-dir", str(tmp_path / "r2")])
    with pytest.raises(ConfigError, match="no config.json .* needs the model's architecture flags"):
        prepare_model(args, Problems())


def test_no_tokenizer_in_a_directory_says_so(tmp_path: Path) -> None:
    from relax.models import load_tokenizer

    with pytest.raises(ConfigError, match=f"^no tokenizer in {tmp_path} \\(looked for tokenizer.json, tokenizer.model"):
        load_tokenizer(str(tmp_path))


def test_a_tokenizer_without_chat_template_is_named(tmp_path: Path) -> None:
    from relax.core.setup import prepare_model
    from relax.models import load_tokenizer, save_hf
    from relax.models.registry import build_model
    from relax.utils.flag_types import Problems

    tok = load_tokenizer("tiny-qwen3")
    tok.chat_template = None
    save_hf(build_model("tiny-qwen3", seed=0), tok, tmp_path / "m")
    p = Problems()
    prepare_model(parse_args([*BASE, "--hf-checkpoint", str(tmp_path / "m"), "--apply-chat-template"]), p)
    assert p.lines == [f"--apply-chat-template: the tokenizer of {tmp_path / 'm'} has no chat template (no "
                       "chat_template in tokenizer_config.json, no chat_template.jinja)"]


def test_a_missing_key_lists_the_keys_the_data_has(tmp_path: Path) -> None:
    from relax.data.dataset import DataError, read_records

    path = tmp_path / "d.jsonl"
    path.write_text('{"question": "1+1=", "answer": "2"}\n')
    with pytest.raises(DataError, match=r":1: missing key 'prompt' \(the record has keys: question, answer\)$"):
        read_records(path, required_keys=["prompt"])
