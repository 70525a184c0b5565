"""The flag surface: every seed-000 flag parses with its documented type and default; the
not-supported gate; precedence; config files; passthrough; validation."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relax.utils.arguments import ConfigError, args_to_dict, parse_args, parse_size
from relax.utils.flag_table import FLAGS, FLAGS_BY_NAME, MiB
from relax.utils.presets import PRESETS

SEED_TSV = Path(__file__).parent / "data" / "seed000_flags.tsv"
DOCUMENTED_TYPES = {"int": "int", "float": "float", "str": "str", "flag": "flag", "json": "json", "bool": "bool",
                    "str (list)": "str_list", "int (list)": "int_list"}
MEGATRON_DEFAULTS = {"optimizer": "adam", "lr-decay-style": "constant", "weight-decay": 0.01, "adam-beta1": 0.9,
                     "adam-beta2": 0.999}


def _seed_rows() -> list[dict[str, str]]:
    lines = SEED_TSV.read_text().splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def _expected_default(row: dict[str, str]):
    name, typ, d = row["name"], row["type"], row["default"]
    if name in MEGATRON_DEFAULTS:
        return MEGATRON_DEFAULTS[name]
    if d in ("None", "-", "Required", '""'):
        return False if (typ == "flag" and d == "-") else None
    special = {"512MB": 512 * MiB, "1GB (1024³)": 1024**3, '["CPU", "GPU"]': ["CPU", "GPU"]}
    if d in special:
        return special[d]
    if typ in ("flag", "bool"):
        return d == "True"
    if typ == "json":
        return json.loads(d)
    if typ == "int":
        return int(float(d))
    if typ == "float":
        return float(d)
    if typ == "str (list)":
        return [d]
    return d


BASE = ["--preset", "quickstart"]


def test_every_seed_flag_is_declared_with_documented_type_and_default() -> None:
    rows = _seed_rows()
    assert len(rows) > 250
    for row in rows:
        spec = FLAGS_BY_NAME.get(row["name"])
        assert spec is not None, f"--{row['name']} missing from the flag table"
        expected_type = DOCUMENTED_TYPES[row["type"]]
        assert spec.type == expected_type or (spec.type == "size" and expected_type == "int"), row
        assert spec.default == _expected_default(row), (row, spec.default)


def test_defaults_reach_the_namespace_unchanged() -> None:
    args = parse_args(["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1",
                       "--train-backend", "torch"])
    for spec in FLAGS:
        if spec.dest in ("train_backend", "prompt_data", "rollout_batch_size", "num_rollout", "output_dir",
                         "eps_clip_high", "critic_lr", "eval_input_key", "global_batch_size",
                         "rollout_max_response_len"):
            continue
        assert getattr(args, spec.dest) == spec.default, spec.name
    assert args.global_batch_size == 2 and args.eps_clip_high == args.eps_clip and args.critic_lr == args.lr


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_parses(name: str) -> None:
    args = parse_args(["--preset", name])
    assert args.preset == name


def test_precedence_preset_config_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lr: 0.01\nn_samples_per_prompt: 4\nrollout-shuffle: false\n")
    args = parse_args([*BASE, "--config", str(cfg)])
    assert args.lr == 0.01 and args.n_samples_per_prompt == 4 and args.rollout_shuffle is False
    args = parse_args(["--lr", "0.5", *BASE, "--config", str(cfg)])
    assert args.lr == 0.5  # command line wins regardless of position
    args = parse_args([*BASE, "--custom-config-path", str(cfg)])
    assert args.lr == 0.01


def test_config_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lrr: 1\n")
    with pytest.raises(ConfigError, match=r"c\.yaml.*'lrr'"):
        parse_args([*BASE, "--config", str(cfg)])
    with pytest.raises(ConfigError, match="config file not found"):
        parse_args([*BASE, "--config", str(tmp_path / "none.yaml")])


def test_typed_values() -> None:
    args = parse_args([*BASE, "--rollout-stop", "a", "b", "--rollout-stop-token-ids", "3", "4",
                       "--apply-chat-template-kwargs", '{"enable_thinking": false}',
                       "--update-weight-buffer-size", "256MB", "--resource", '{"rollout": [2, 0]}'])
    assert args.rollout_stop == ["a", "b"] and args.rollout_stop_token_ids == [3, 4]
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}
    assert args.update_weight_buffer_size == 256 * MiB and args.resource == {"rollout": [2, 0]}
    with pytest.raises(ConfigError, match="--rollout-batch-size"):
        parse_args([*BASE, "--rollout-batch-size", "two"])
    with pytest.raises(ConfigError, match="invalid JSON"):
        parse_args([*BASE, "--resource", "{nope"])
    with pytest.raises(ConfigError, match="invalid choice"):
        parse_args([*BASE, "--kl-loss-type", "k9"])


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "K", "M", "G"]), st.sampled_from(["B", "iB", ""]))
def test_size_parsing(n: int, unit: str, suffix: str) -> None:
    factor = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3}[unit]
    text = f"{n}{unit}{suffix if unit else ''}"
    assert parse_size(text) == n * factor


def test_unknown_flag_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match=r"unknown flag --rollout-batchsize \(did you mean --rollout-batch-size\?\)"):
        parse_args([*BASE, "--rollout-batchsize", "3"])


def test_sglang_passthrough_collected_but_refused_with_embedded_engine() -> None:
    from relax.utils.arguments import _collect_passthrough

    assert _collect_passthrough(["--sglang-mem-x", "0.5", "--sglang-enable-y", "--sglang-z=3"]) == {
        "mem_x": "0.5", "enable_y": True, "z": "3"}
    with pytest.raises(ConfigError, match="not supported yet: --sglang-mem-x"):
        parse_args([*BASE, "--sglang-mem-x", "0.5"])


@pytest.mark.parametrize("flags", [["--use-tis"], ["--fully-async"], ["--max-staleness", "2"], ["--polling-mode", "false"],
                                   ["--distributed-backend", "gloo"]])
def test_unsupported_flags_fail_loudly(flags: list[str]) -> None:
    with pytest.raises(ConfigError, match=f"^not supported yet: {flags[0]}$"):
        parse_args([*BASE, *flags])


def test_unsupported_choice_values_fail_loudly() -> None:
    with pytest.raises(ConfigError, match="not supported yet: --advantage-estimator ppo"):
        parse_args([*BASE, "--advantage-estimator", "ppo"])
    with pytest.raises(ConfigError, match="not supported yet: --train-backend megatron"):
        parse_args([*BASE, "--train-backend", "megatron"])


def test_default_value_of_an_unsupported_flag_is_accepted() -> None:
    args = parse_args([*BASE, "--max-staleness", "0", "--polling-mode", "true"])
    assert args.max_staleness == 0


@pytest.mark.parametrize("flags, message", [
    (["--global-batch-size", "100"], "--global-batch-size 100 must divide"),
    (["--num-steps-per-rollout", "3"], "--num-steps-per-rollout 3 must divide"),
    (["--micro-batch-size", "100"], "--micro-batch-size 100 must divide"),
    (["--num-rollout", "0"], "--num-rollout must be >= 1"),
    (["--save-interval", "0"], "--save-interval must be >= 1"),
])
def test_validation_errors(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_required_inputs() -> None:
    with pytest.raises(ConfigError, match="--prompt-data is required"):
        parse_args(["--train-backend", "torch", "--rollout-batch-size", "2", "--num-rollout", "1"])
    with pytest.raises(ConfigError, match="set --num-rollout or --num-epoch"):
        parse_args(["--train-backend", "torch", "--prompt-data", "x", "--rollout-batch-size", "2"])
    with pytest.raises(ConfigError, match="--rollout-batch-size is required"):
        parse_args(["--train-backend", "torch", "--prompt-data", "x", "--num-rollout", "1"])


def test_derived_values() -> None:
    args = parse_args([*BASE, "--num-steps-per-rollout", "4"])
    assert args.global_batch_size == 64 and args.micro_batch_size == 64
    assert args.offload_train is True and args.offload_rollout is True  # --colocate implies offload
    json.dumps(args_to_dict(args))


def test_flags_doc_is_up_to_date() -> None:
    from relax.utils.flag_docs import render

    doc = Path(__file__).parents[1] / "docs" / "flags.md"
    assert doc.read_text() == render(), "regenerate: python -m relax.utils.flag_docs > docs/flags.md"
