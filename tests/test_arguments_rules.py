"""The not-supported gate, the SGLang passthrough, required flags, cross-flag validation and
derived defaults of ``relax train``."""

from __future__ import annotations

import re

import pytest

import relax.utils.arguments as arguments
import relax.utils.machine_flags as machine_flags
from relax.utils.arguments import ConfigError, parse_args
from relax.utils.flag_table import FLAGS, FLAGS_BY_NAME

BASE = ["--preset", "quickstart"]  # 32 prompts x 8 samples = 256 per rollout
MINIMAL = ["--train-backend", "torch", "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1"]


@pytest.fixture
def no_gate(monkeypatch: pytest.MonkeyPatch) -> None:
    """Reach the cross-flag rules of flags whose features are not implemented yet."""
    monkeypatch.setattr(arguments, "check_supported", lambda args: None)


@pytest.fixture
def gpu_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse as on a machine with a GPU: GPU-only flags reach the gate and the rules."""
    monkeypatch.setattr(machine_flags, "has_gpu", lambda args: True)


# ---------------------------------------------------------------------- the gate
# Built from the table, so the tests follow as helpers mark features supported.
_SAMPLES = {"int": ["7"], "float": ["0.5"], "flag": [], "bool": ["false"], "json": ['{"a": 1}'],
            "str_list": ["a", "b"], "int_list": ["1", "2"], "size": ["3MB"], "str": ["x"]}


def _non_default_tokens(spec) -> list[str]:
    if spec.choices:
        return [next(c for c in spec.choices if c != spec.default)]
    if spec.type == "bool":
        return ["false" if spec.default else "true"]
    return _SAMPLES[spec.type]


UNSUPPORTED = [spec for spec in FLAGS if not spec.supported]
UNSUPPORTED_VALUES = [(spec, value) for spec in FLAGS if spec.supported_values is not None
                      for value in (spec.choices or ()) if value not in spec.supported_values]


def _needs_gpu(spec, tokens: list[str]) -> bool:
    needs = machine_flags.GPU_FLAGS.get(spec.dest)
    return needs is not None and needs[0](parse_args.__globals__["build_parser"]().parse_args(
        [f"--{spec.name}", *tokens]).__dict__[spec.dest])


def _refusal(spec) -> str:
    """The line refusing ``spec``: its name, and what rules it out where something outside relax does."""
    return f"not supported yet: --{spec.name}" + (f" ({spec.not_yet_why})" if spec.not_yet_why else "")


@pytest.mark.parametrize("spec", UNSUPPORTED, ids=lambda s: s.name)
def test_unsupported_flags_fail_loudly(spec, gpu_machine: None) -> None:
    with pytest.raises(ConfigError, match=f"^{re.escape(_refusal(spec))}$"):
        parse_args([*BASE, f"--{spec.name}", *_non_default_tokens(spec)])


@pytest.mark.parametrize("spec", [s for s in UNSUPPORTED if _needs_gpu(s, _non_default_tokens(s))],
                         ids=lambda s: s.name)
def test_unsupported_gpu_flags_name_the_missing_gpu_on_a_cpu_machine(spec) -> None:
    """On a machine without a GPU the check that names the missing GPU refuses them, and nothing else does."""
    with pytest.raises(ConfigError, match=f"^--{spec.name}( \\S+)? needs a CUDA GPU \\(.*\\); --device cpu uses none$"):
        parse_args([*BASE, f"--{spec.name}", *_non_default_tokens(spec)])


@pytest.mark.parametrize("spec, value", UNSUPPORTED_VALUES, ids=lambda x: getattr(x, "name", x))
def test_unsupported_choice_values_name_the_value(spec, value: str, gpu_machine: None) -> None:
    why = re.escape(f" ({spec.not_yet_why})") if spec.not_yet_why else ""
    with pytest.raises(ConfigError, match=f"^not supported yet: --{spec.name} {value}{why}$"):
        parse_args([*BASE, f"--{spec.name}", value])


def test_seed_default_backend_without_a_gpu_falls_back_to_torch_with_a_notice(monkeypatch) -> None:
    """The seeds' scripts never name a backend; on a machine without a GPU the default megatron becomes torch,
    said in a notice. Asked for explicitly, megatron is refused naming the missing GPU."""
    assert FLAGS_BY_NAME["train-backend"].default == "megatron"
    monkeypatch.setattr("relax.backends.megatron.checks._cuda_available", lambda: False)
    args = parse_args(["--prompt-data", "x", "--rollout-batch-size", "2", "--num-rollout", "1"])
    assert args.train_backend == "torch" and args.bf16 is False
    assert args.notices == ["the default --train-backend megatron needs a CUDA GPU and this machine has none: "
                            "training with --train-backend torch (pass it to silence this notice)"]
    with pytest.raises(ConfigError, match=r"^--train-backend megatron needs a CUDA GPU \(this machine has none\)"):
        parse_args(["--train-backend", "megatron", "--prompt-data", "x", "--rollout-batch-size", "2",
                    "--num-rollout", "1"])


def test_every_unsupported_flag_is_reported_in_table_order(gpu_machine: None) -> None:
    first, second = UNSUPPORTED[0], UNSUPPORTED[-1]
    argv = [*BASE, f"--{second.name}", *_non_default_tokens(second), f"--{first.name}", *_non_default_tokens(first)]
    with pytest.raises(ConfigError) as info:
        parse_args(argv)
    assert info.value.problems == [_refusal(first), _refusal(second)]
    assert str(info.value) == "\n".join(info.value.problems)


def test_unsupported_flag_from_a_config_file_is_refused(tmp_path) -> None:
    spec = next(s for s in UNSUPPORTED if s.type == "flag" and s.default is False)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"{spec.dest}: true\n")
    with pytest.raises(ConfigError, match=f"^{re.escape(_refusal(spec))}$"):
        parse_args([*BASE, "--config", str(cfg)])


def test_documented_default_of_an_unsupported_flag_is_accepted() -> None:
    argv = list(BASE)
    for spec in UNSUPPORTED:
        if spec.type in ("int", "float", "str") and spec.default is not None and not spec.choices:
            argv += [f"--{spec.name}", str(spec.default)]
        elif spec.type == "bool":
            argv += [f"--{spec.name}", str(spec.default).lower()]
    assert len(argv) > len(BASE)  # at least one unsupported flag with its documented default (fewer as they land)
    parse_args(argv)


@pytest.mark.parametrize("flags, dest, value", [
    (["--lr", "0.5"], "lr", 0.5),
    (["--optimizer", "adam"], "optimizer", "adam"),
    (["--rollout-top-k", "-1"], "rollout_top_k", -1),
    (["--rollout-top-k", "5"], "rollout_top_k", 5),
    (["--seed", "7"], "seed", 7),
    (["--kl-loss-type", "low_var_kl"], "kl_loss_type", "low_var_kl"),
    (["--device", "auto"], "device", "auto"),
    (["--save", "ckpt", "--save-interval", "5"], "save_interval", 5),
])
def test_supported_flags_pass(flags: list[str], dest: str, value) -> None:
    assert getattr(parse_args([*BASE, *flags]), dest) == value


def test_colocate_implies_offload_without_tripping_the_gate() -> None:
    args = parse_args([*MINIMAL, "--colocate"])
    assert args.offload_train is True and args.offload_rollout is True
    args = parse_args(MINIMAL)
    assert args.offload_train is False and args.offload_rollout is False  # None resolves to --offload


# ---------------------------------------------------------------------- passthrough
def test_sglang_passthrough_is_collected() -> None:
    """Undeclared ``--sglang-*`` flags are collected as they come; relax/backends/sglang/ types and checks them."""
    rest, passthrough = arguments._split_passthrough(
        [*BASE, "--sglang-mem-x", "0.5", "--sglang-enable-y", "--lr", "0.1", "--sglang-z=3", "--sglang-neg", "-1"])
    assert passthrough == {"mem_x": "0.5", "enable_y": True, "z": "3", "neg": "-1"}
    assert rest == [*BASE, "--lr", "0.1"]
    rest, passthrough = arguments._split_passthrough(["--sglang-profile", "--sglang-profile-steps", "3", "10"])
    assert passthrough == {} and rest == ["--sglang-profile", "--sglang-profile-steps", "3", "10"]  # declared flags


def test_sglang_passthrough_from_config_file(tmp_path) -> None:
    cfg = tmp_path / "c.yaml"
    cfg.write_text("sglang_chunked_prefill_size: 512\nsglang-mem-fraction-static: 0.7\n")
    from relax.utils.flag_types import Problems

    values, passthrough, _ = arguments._lower_layers({"config": str(cfg)}, Problems())
    assert passthrough == {"chunked_prefill_size": 512}
    assert values["sglang_mem_fraction_static"] == 0.7  # declared in the table


def test_sglang_flags_need_the_sglang_backend() -> None:
    with pytest.raises(ConfigError, match="^--sglang-mem-x configures SGLang servers: it needs --rollout-backend "
                                          "sglang$"):
        parse_args([*BASE, "--sglang-mem-x", "0.5"])


# ---------------------------------------------------------------------- required inputs
def test_required_inputs(tmp_path) -> None:
    with pytest.raises(ConfigError, match="^--rollout-batch-size is required$"):
        parse_args(["--train-backend", "torch", "--prompt-data", "x", "--num-rollout", "1"])
    with pytest.raises(ConfigError, match="^--prompt-data is required$"):
        parse_args(["--train-backend", "torch", "--rollout-batch-size", "2", "--num-rollout", "1"])
    with pytest.raises(ConfigError, match="^set --num-rollout or --num-epoch$"):
        parse_args(["--train-backend", "torch", "--prompt-data", "x", "--rollout-batch-size", "2"])
    cfg = tmp_path / "c.yaml"
    cfg.write_text("rollout_batch_size: 3\n")
    args = parse_args(["--train-backend", "torch", "--prompt-data", "x", "--num-epoch", "1", "--config", str(cfg)])
    assert args.rollout_batch_size == 3 and args.num_rollout is None


def test_replaying_rollouts_needs_no_prompts_or_step_count() -> None:
    base = ["--train-backend", "torch", "--rollout-batch-size", "2"]
    args = parse_args([*base, "--load-debug-rollout-data", "d.json"])
    assert args.debug_train_only is True and args.num_rollout is None  # implied; steps: the files on disk
    with pytest.raises(ConfigError, match="^set --num-rollout or --num-epoch$"):  # it generates from --prompt-data
        parse_args([*base, "--prompt-data", "x", "--debug-rollout-only"])


# ---------------------------------------------------------------------- cross-flag rules
@pytest.mark.parametrize("flags, message", [
    (["--global-batch-size", "100"],
     "^--global-batch-size 100 must divide rollout-batch-size x n-samples-per-prompt = 32 x 8 = 256$"),
    (["--num-steps-per-rollout", "3"], "^--num-steps-per-rollout 3 must divide .* = 32 x 8 = 256$"),
    (["--micro-batch-size", "100"], "^--micro-batch-size 100 must divide --global-batch-size 256$"),
    (["--global-batch-size", "128", "--micro-batch-size", "48"], "--micro-batch-size 48 must divide"),
    (["--global-batch-size", "64", "--num-steps-per-rollout", "2"],
     "^--global-batch-size 64 conflicts with --num-steps-per-rollout 2, which sets it to 256 / 2 = 128$"),
    (["--num-rollout", "0"], "^--num-rollout must be >= 1, got 0$"),
    (["--rollout-batch-size", "0"], "^--rollout-batch-size must be >= 1, got 0$"),
    (["--save-interval", "0"], "^--save-interval must be >= 1, got 0$"),
    (["--kl-coef", "0.1", "--kl-loss-coef", "0.1"], "^--kl-coef 0.1 and --kl-loss-coef 0.1 are mutually exclusive"),
    (["--loss-type", "custom_loss"], "^--loss-type custom_loss requires --custom-loss-function-path$"),
    (["--rm-type", "remote_rm"], "^--rm-type remote_rm requires --rm-url$"),
])
def test_validation_errors(flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


@pytest.mark.parametrize("flags, message", [
    (["--only-train-params-name-list", "a", "--freeze-params-name-list", "b"],
     "^--only-train-params-name-list and --freeze-params-name-list cannot be used together$"),
    (["--use-opd"], r"^--use-opd requires --opd-type \(sglang or megatron\)$"),
    (["--use-opd", "--opd-type", "megatron"], "^--opd-type megatron requires --opd-teacher-load$"),
    (["--use-dynamic-batch-size"], "^--use-dynamic-batch-size requires --max-tokens-per-gpu$"),
    (["--over-sampling-batch-size", "8"], "^--over-sampling-batch-size 8 must be >= --rollout-batch-size 32$"),
])
def test_validation_errors_of_unimplemented_features(no_gate: None, flags: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_valid_combinations_pass(no_gate: None) -> None:
    parse_args([*BASE, "--use-opd", "--opd-type", "megatron", "--opd-teacher-load", "t"])
    parse_args([*BASE, "--use-dynamic-batch-size", "--max-tokens-per-gpu", "4096", "--micro-batch-size", "7"])
    parse_args([*BASE, "--kl-coef", "0.1"])
    parse_args([*BASE, "--rm-type", "remote_rm", "--rm-url", "http://127.0.0.1:1"])


# ---------------------------------------------------------------------- derived defaults
def test_batch_size_defaults() -> None:
    assert parse_args(BASE).global_batch_size == 256
    args = parse_args([*BASE, "--num-steps-per-rollout", "4"])
    assert args.global_batch_size == 64
    args = parse_args([*BASE, "--num-steps-per-rollout", "4", "--global-batch-size", "64"])
    assert args.global_batch_size == 64


def test_when_none_defaults() -> None:
    args = parse_args([*BASE, "--eps-clip", "0.3", "--lr", "0.02", "--input-key", "q",
                       "--rollout-max-context-len", "64", "--reward-key", "acc"])
    assert args.eps_clip_high == 0.3 and args.critic_lr == 0.02 and args.eval_input_key == "q"
    assert args.eval_max_context_len == 64 and args.eval_reward_key == "acc"
    args = parse_args([*BASE, "--eps-clip-high", "0.28"])
    assert args.eps_clip == 0.2 and args.eps_clip_high == 0.28


def test_implied_flags(no_gate: None) -> None:
    args = parse_args([*MINIMAL, "--offload"])
    assert args.offload_train is True and args.offload_rollout is True
    args = parse_args([*MINIMAL, "--use-rollout-routing-replay"])
    assert args.use_routing_replay is True
    args = parse_args([*MINIMAL, "--load-debug-rollout-data", "d.pt"])
    assert args.debug_train_only is True


def test_defaults_reach_the_namespace_unchanged() -> None:
    args = parse_args(MINIMAL)
    resolved = {"train_backend", "prompt_data", "rollout_batch_size", "num_rollout", "output_dir", "eps_clip_high",
                "critic_lr", "eval_input_key", "global_batch_size", "rollout_max_response_len", "offload_train",
                "offload_rollout", "eval_function_path", "qkv_format"}
    for spec in FLAGS:
        if spec.dest not in resolved:
            assert getattr(args, spec.dest) == spec.default, spec.name
    assert args.global_batch_size == 2 and args.eps_clip_high == args.eps_clip and args.critic_lr == args.lr
    assert args.eval_function_path == args.rollout_function_path
    assert args.qkv_format == "bshd"  # the seed's thd: what relax builds (padded micro-batches) instead
