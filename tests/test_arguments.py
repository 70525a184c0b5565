"""The flag surface: every seed-000 flag is declared with its documented type and default,
values are typed the same from the CLI, config files and presets, layers take precedence in
the documented order, and docs/flags.md is generated from the table.
(Gate and cross-flag rules: test_arguments_rules.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relax.distributed.resources import trainer_ranks
from relax.utils.arguments import ConfigError, args_to_dict, build_parser, format_flag, parse_args, parse_size
from relax.utils.flag_table import FLAGS, FLAGS_BY_NAME, SUPPORTED, SUPPORTED_VALUES, MiB
from relax.utils.flag_types import format_size
from relax.utils.presets import PRESETS, get_preset
from tests.e2e_helpers import pretend_gpu_machine

SEED_TSV = Path(__file__).parent / "data" / "seed000_flags.tsv"  # extracted once from seed 000's tables
DOCUMENTED_TYPES = {"int": "int", "float": "float", "str": "str", "flag": "flag", "json": "json", "bool": "bool",
                    "str (list)": "str_list", "int (list)": "int_list"}
# Seed default "-" on Megatron-native flags means Megatron-LM's own default.
MEGATRON_DEFAULTS = {"optimizer": "adam", "lr-decay-style": "constant", "weight-decay": 0.01, "adam-beta1": 0.9,
                     "adam-beta2": 0.999}
SPECIAL_DEFAULTS = {"512MB": 512 * MiB, "1GB (1024³)": 1024**3, '["CPU", "GPU"]': ["CPU", "GPU"]}
ADDITIONS = {"preset", "output-dir", "config", "device", "rollout-backend", "gamma", "lambd",
             "embedded-runner", "embedded-cuda-graph", "embedded-compile", "weight-sync-transport",
             "no-bias-swiglu-fusion", "no-bias-dropout-fusion", "no-rope-fusion",  # Megatron-LM flags, not in seed 000
             "lr-wsd-decay-iters", "lr-wsd-decay-style",  # Megatron-LM's, for --lr-decay-style WSD
             "sgd-momentum",  # Megatron-LM's, for --optimizer sgd
             "ref-actor-config",  # seed 004's fully-async services (not in seed 000's tables)
             "ray-address",  # the Ray cluster to join (relax/distributed/cluster.py)
             "debug", "bf16",
             "overwrite-output-dir", "hook-timeout",  # one run per output dir; bounded user hooks
             "weight-sync-timeout",  # bounded engine calls of a sync (docs/waits.md)
             "fleet-control-addr", "fleet-control-api-key"}  # the elastic fleet's control endpoint
# Megatron-LM's architecture flags that seed 001's scripts/models/*.sh pass (their own group)
MODEL_FLAG_NAMES = {
    "num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention", "num-query-groups",
    "kv-channels", "swiglu", "normalization", "norm-epsilon", "position-embedding-type",
    "use-rotary-position-embeddings", "rotary-base", "rotary-percent", "vocab-size", "make-vocab-size-divisible-by",
    "untie-embeddings-and-output-weights", "disable-bias-linear", "add-qkv-bias", "qk-layernorm",
    "max-position-embeddings", "seq-length", "init-method-std", "attention-dropout", "hidden-dropout",
    "attention-softmax-in-fp32", "accumulate-allreduce-grads-in-fp32", "attention-backend"}
BASE = ["--preset", "quickstart"]


def _seed_rows() -> list[dict[str, str]]:
    lines = SEED_TSV.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"), strict=True)) for line in lines[1:]]


def _expected_default(row: dict[str, str]):
    name, typ, d = row["name"], row["type"], row["default"]
    if name in MEGATRON_DEFAULTS:
        return MEGATRON_DEFAULTS[name]
    if d in SPECIAL_DEFAULTS:
        return SPECIAL_DEFAULTS[d]
    if d in ("None", "-", "Required", '""'):
        return False if (typ == "flag" and d == "-") else None
    if typ in ("flag", "bool"):
        return {"True": True, "False": False}[d]
    if typ == "json":
        return json.loads(d)
    if typ == "int":
        return int(float(d))
    if typ == "float":
        return float(d)
    if typ == "str (list)":
        return [d]
    return d


# ---------------------------------------------------------------------- the table
def test_every_seed_flag_is_declared_with_documented_type_and_default() -> None:
    rows = _seed_rows()
    assert len(rows) == 268
    for row in rows:
        spec = FLAGS_BY_NAME.get(row["name"])
        assert spec is not None, f"--{row['name']} missing from the flag table"
        expected_type = DOCUMENTED_TYPES[row["type"]]
        assert spec.type == expected_type or (spec.type == "size" and expected_type == "int"), row
        assert spec.default == _expected_default(row), (row, spec.default)
    assert FLAGS_BY_NAME["rollout-batch-size"].required


def test_flags_outside_the_seed_are_the_documented_additions() -> None:
    seed_names = {row["name"] for row in _seed_rows()}
    extra = {spec.name for spec in FLAGS} - seed_names
    assert extra == ADDITIONS | MODEL_FLAG_NAMES
    assert all(FLAGS_BY_NAME[name].group == "Relax harness additions" for name in ADDITIONS)
    assert all(FLAGS_BY_NAME[name].group == "Megatron Model Architecture" for name in MODEL_FLAG_NAMES)
    assert len(FLAGS) == len(FLAGS_BY_NAME), "a flag is declared twice"


def test_choices_from_the_brief() -> None:
    assert FLAGS_BY_NAME["kl-loss-type"].choices == ("k1", "k2", "k3", "low_var_kl")
    assert set(FLAGS_BY_NAME["advantage-estimator"].choices) == {
        "grpo", "gspo", "on_policy_distillation", "sapo", "reinforce_plus_plus", "reinforce_plus_plus_baseline",
        "rloo", "ppo", "cispo"}
    assert set(FLAGS_BY_NAME["train-backend"].choices) == {"megatron", "torch"}
    assert FLAGS_BY_NAME["train-backend"].default == "megatron"
    assert FLAGS_BY_NAME["device"].choices == ("auto", "cpu", "cuda")
    assert FLAGS_BY_NAME["rollout-backend"].default == "embedded"


def test_support_marks_name_real_flags_and_values() -> None:
    assert SUPPORTED <= set(FLAGS_BY_NAME), SUPPORTED - set(FLAGS_BY_NAME)
    for name, values in SUPPORTED_VALUES.items():
        spec = FLAGS_BY_NAME[name]
        assert spec.supported and spec.supported_values == values
        assert spec.choices is None or values <= set(spec.choices), name
    assert FLAGS_BY_NAME["train-backend"].supported_values == {"torch", "megatron"}
    assert FLAGS_BY_NAME["rollout-backend"].supported_values == {"embedded", "sglang"}
    assert not FLAGS_BY_NAME["allgather-cp"].supported


def test_megatron_native_defaults_say_so_in_the_help() -> None:
    for name in ("optimizer", "lr-decay-style", "weight-decay", "adam-beta1", "adam-beta2", "recompute-granularity",
                 "use-distributed-optimizer"):
        assert "Megatron-LM" in FLAGS_BY_NAME[name].help, name


# ---------------------------------------------------------------------- types on the command line
def _sample(spec) -> tuple[list[str], object]:
    """A non-default command-line value for ``spec`` and what it must parse to."""
    samples = {
        "int": (["7"], 7), "float": (["0.5"], 0.5), "flag": ([], True), "bool": (["false"], False),
        "json": (['{"a": [1, 2]}'], {"a": [1, 2]}), "str_list": (["a", "b"], ["a", "b"]),
        "int_list": (["1", "2"], [1, 2]), "size": (["2MB"], 2 * MiB), "str": (["x"], "x"),
    }
    tokens, value = samples[spec.type]
    if spec.choices:  # a list flag's choices are per item
        tokens, value = [spec.choices[-1]], spec.choices[-1]
        if spec.type in ("str_list", "int_list"):
            value = [value]
    return tokens, value


@pytest.mark.parametrize("spec", FLAGS, ids=lambda s: s.name)
def test_every_flag_parses_with_its_type(spec) -> None:
    tokens, expected = _sample(spec)
    namespace = build_parser().parse_args([f"--{spec.name}", *tokens])
    assert getattr(namespace, spec.dest) == expected
    assert vars(namespace).keys() == {spec.dest}, "absent flags must stay absent at the argparse layer"


def test_trainer_ranks_are_data_parallel_for_both_backends(monkeypatch) -> None:
    dp2 = ["--resource", '{"actor": [2, 1]}']
    cpu = parse_args([*BASE, *dp2])  # no GPU here: two data-parallel torch ranks, each a CPU actor
    assert cpu.resource == {"actor": [2, 0]} and trainer_ranks(cpu.resource) == 2
    assert any("every role runs on the CPU, one actor per replica" in n for n in cpu.notices)
    pretend_gpu_machine(monkeypatch)
    args = parse_args([*BASE, *dp2, "--train-backend", "megatron", "--device", "cuda"])  # Megatron DP = 2
    assert args.train_backend == "megatron" and args.tensor_model_parallel_size == 1
    assert args.resource == {"actor": [2, 1]} and trainer_ranks(args.resource) == 2


def test_bad_values_name_the_flag() -> None:
    with pytest.raises(ConfigError, match=r"--rollout-batch-size: expected an integer, got 'two'"):
        parse_args([*BASE, "--rollout-batch-size", "two"])
    with pytest.raises(ConfigError, match=r"--lr: expected a number"):
        parse_args([*BASE, "--lr", "fast"])
    with pytest.raises(ConfigError, match=r"--resource: invalid JSON"):
        parse_args([*BASE, "--resource", "{nope"])
    with pytest.raises(ConfigError, match=r"--distributed-timeout-minutes must be >= 1"):
        parse_args([*BASE, "--distributed-timeout-minutes", "0"])
    with pytest.raises(ConfigError, match=r"--kl-loss-type: invalid choice: 'k9'"):
        parse_args([*BASE, "--kl-loss-type", "k9"])
    with pytest.raises(ConfigError, match=r"--polling-mode: not a boolean"):
        parse_args([*BASE, "--polling-mode", "maybe"])
    with pytest.raises(ConfigError, match=r"--update-weight-buffer-size: not a size"):
        parse_args([*BASE, "--update-weight-buffer-size", "lots"])
    with pytest.raises(ConfigError, match=r"--lr: expected one argument"):
        parse_args([*BASE, "--lr"])


def test_json_list_size_and_bool_values() -> None:
    args = parse_args([*BASE, "--rollout-stop", "a", "b", "--rollout-stop-token-ids", "3", "4",
                       "--apply-chat-template-kwargs", '{"enable_thinking": false}',
                       "--update-weight-buffer-size", "256MB", "--resource", '{"rollout": [2, 0]}'])
    assert args.rollout_stop == ["a", "b"] and args.rollout_stop_token_ids == [3, 4]
    assert args.apply_chat_template_kwargs == {"enable_thinking": False}
    assert args.update_weight_buffer_size == 256 * MiB and args.resource == {"rollout": [2, 0]}
    assert parse_args([*BASE, "--update-weight-buffer-size", "1048576"]).update_weight_buffer_size == MiB
    for tokens in (["--polling-mode", "true"], ["--polling-mode"], []):
        assert parse_args([*BASE, *tokens]).polling_mode is True


def test_defaults_are_fresh_copies() -> None:
    a = parse_args(BASE)
    a.apply_chat_template_kwargs["x"] = 1
    assert parse_args(BASE).apply_chat_template_kwargs == {}
    assert FLAGS_BY_NAME["apply-chat-template-kwargs"].default == {}


@given(st.integers(min_value=0, max_value=10**6), st.sampled_from(["", "K", "M", "G", "T"]),
       st.sampled_from(["B", "iB", ""]))
def test_size_parsing(n: int, unit: str, suffix: str) -> None:
    factor = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4}[unit]
    text = f"{n}{unit}{suffix if unit else ''}"
    assert parse_size(text) == n * factor
    assert parse_size(n * factor) == n * factor


@given(st.integers(min_value=0, max_value=2**50))
def test_size_round_trip(n: int) -> None:
    assert parse_size(format_size(n)) == n


@pytest.mark.parametrize("text", ["", "MB", "-1MB", "1.5.2GB", "1XB", "1iB", "one GB"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_unknown_flag_suggests_the_closest() -> None:
    with pytest.raises(ConfigError, match=r"^unknown flag --rollout-batchsize \(did you mean --rollout-batch-size\?\)$"):
        parse_args([*BASE, "--rollout-batchsize", "3"])
    with pytest.raises(ConfigError, match=r"^unknown flag --zzzz$"):
        parse_args([*BASE, "--zzzz"])
    with pytest.raises(ConfigError, match="unexpected argument 'stray'"):
        parse_args([*BASE, "stray"])
    with pytest.raises(ConfigError, match="unknown flag --rollout-batch"):  # no abbreviations
        parse_args([*BASE, "--rollout-batch", "3"])


# ---------------------------------------------------------------------- layers
@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_parses(name: str) -> None:
    args = parse_args(["--preset", name])
    assert args.preset == name
    for dest, value in PRESETS[name].items():
        if dest != "global_batch_size":
            assert getattr(args, dest) == value, dest


def test_quickstart_preset() -> None:
    import relax

    q = get_preset("quickstart")
    assert q["prompt_data"] == str(Path(relax.__file__).resolve().parent / "models/tasks/maxdigit.jsonl")
    assert q["train_backend"] == "torch" and q["device"] == "cpu" and q["hf_checkpoint"] == "tiny-qwen3"
    q["lr"] = 99.0
    assert get_preset("quickstart")["lr"] != 99.0, "get_preset must hand out a copy"


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(ConfigError, match=r"unknown --preset 'nope'; known presets: .*quickstart"):
        parse_args(["--preset", "nope"])


def test_precedence_preset_config_cli(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("lr: 0.01\nn_samples_per_prompt: 4\nrollout-shuffle: false\nupdate_weight_buffer_size: 64MB\n")
    args = parse_args([*BASE, "--config", str(cfg)])
    assert args.lr == 0.01 and args.n_samples_per_prompt == 4 and args.rollout_shuffle is False
    assert args.update_weight_buffer_size == 64 * MiB
    assert args.rollout_batch_size == PRESETS["quickstart"]["rollout_batch_size"]  # preset still shows through
    for argv in (["--lr", "0.5", *BASE, "--config", str(cfg)], [*BASE, "--config", str(cfg), "--lr", "0.5"]):
        assert parse_args(argv).lr == 0.5  # the command line wins regardless of position
    assert parse_args([*BASE, "--custom-config-path", str(cfg)]).lr == 0.01
    assert parse_args(["--lr", "1e-3", *BASE]).lr == 1e-3


def test_config_file_may_name_the_preset_and_provide_required_flags(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("preset: quickstart\nrollout_batch_size: 4\nglobal_batch_size: 32\nmicro_batch_size: 8\n")
    args = parse_args(["--config", str(cfg)])
    assert args.preset == "quickstart" and args.train_backend == "torch" and args.rollout_batch_size == 4


def test_config_file_errors_name_the_file_and_key(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    for text, pattern in [
        ("lrr: 1\n", r"--config: .*c\.yaml: unknown key 'lrr'"),
        ("lr: fast\n", r"c\.yaml: key 'lr': expected a number"),
        ("kl_loss_type: k9\n", r"c\.yaml: key 'kl_loss_type': 'k9' is not one of k1, k2, k3, low_var_kl"),
        ("config: other.yaml\n", r"c\.yaml: unknown key 'config'"),
        ("- lr\n", r"c\.yaml: expected a mapping"),
        ("lr: null\n", r"c\.yaml: key 'lr': null is not a value"),
        ("lr: [\n", r"c\.yaml: invalid YAML"),
    ]:
        cfg.write_text(text)
        with pytest.raises(ConfigError, match=pattern):
            parse_args([*BASE, "--config", str(cfg)])
    with pytest.raises(ConfigError, match="--custom-config-path: config file not found"):
        parse_args([*BASE, "--custom-config-path", str(tmp_path / "none.yaml")])
    cfg.write_text("")
    assert parse_args([*BASE, "--config", str(cfg)]).lr == PRESETS["quickstart"]["lr"]


def test_config_file_types_lists_and_json(tmp_path: Path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout_stop: [a, b]\nrollout-stop-token-ids: 7\nresource: {rollout: [1, 0]}\n"
                   "apply_chat_template_kwargs: '{\"x\": 1}'\n")
    args = parse_args([*BASE, "--config", str(cfg)])
    assert args.rollout_stop == ["a", "b"] and args.rollout_stop_token_ids == [7]
    assert args.resource == {"rollout": [1, 0]} and args.apply_chat_template_kwargs == {"x": 1}


# ---------------------------------------------------------------------- outputs
def test_extra_attributes_and_run_json() -> None:
    args = parse_args(BASE)
    assert args.sglang_passthrough == {}
    assert args.output_dir.startswith("runs/") and args.device == "cpu" and args.rollout_backend == "embedded"
    assert parse_args([*BASE, "--output-dir", "out"]).output_dir == "out"
    data = args_to_dict(args)
    assert json.loads(json.dumps(data)) == data
    assert data["rollout_batch_size"] == args.rollout_batch_size


def test_format_flag() -> None:
    assert format_flag("rollout_batch_size") == "--rollout-batch-size"
    assert format_flag("rollout-batch-size") == "--rollout-batch-size"
    assert format_flag("--lr") == "--lr"


def test_config_error_is_one_line() -> None:
    assert str(ConfigError("a\nb  c")) == "a b c"
    assert isinstance(ConfigError("x"), ValueError)


def test_flags_doc_is_up_to_date() -> None:
    from relax.utils.flag_docs import render

    doc = Path(__file__).parents[1] / "docs" / "flags.md"
    assert doc.read_text(encoding="utf-8") == render(), "regenerate: python -m relax.utils.flag_docs > docs/flags.md"
    for spec in FLAGS:
        assert f"`--{spec.name}`" in doc.read_text(encoding="utf-8")


def test_five_bad_values_give_five_lines() -> None:
    """One pass: every value check of a launch is reported, one line each, before anything starts."""
    with pytest.raises(ConfigError) as err:
        parse_args(["--preset", "quickstart", "--rollout-batch-size", "0", "--eps-clip", "-1", "--input-key", "",
                    "--lr", "-1", "--rollout-top-p", "2"])
    assert sorted(err.value.problems) == sorted([
        "--rollout-batch-size must be >= 1, got 0", "--eps-clip must be > 0, got -1.0",
        "--input-key must be non-empty, got ''", "--lr must be >= 0, got -1.0",
        "--rollout-top-p must be > 0 and <= 1, got 2.0"])


def test_every_bound_names_a_flag_of_a_type_it_can_check() -> None:
    from relax.utils.flag_table import BOUNDS, FLAGS_BY_NAME

    for name, bound in BOUNDS.items():
        kind = FLAGS_BY_NAME[name].type
        assert kind == "str" if bound.nonempty else kind in ("int", "float", "size"), name
