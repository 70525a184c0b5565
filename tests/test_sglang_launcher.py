"""The SGLang launcher, tested by the command it builds, and the ``--sglang-*`` flag mapping.

Real SGLang runs where it is installed (tests/sglang/, marker ``sglang``); here the options are checked
against SGLang's option list pinned from its source (relax/backends/sglang/server_args.json).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from relax.backends.sglang import launcher
from relax.backends.sglang.config import SGLangLaunchConfig
from relax.backends.sglang.server_args import PINNED, RESERVED, pinned, server_arg_tokens
from relax.utils.arguments import parse_args
from relax.utils.flag_table import FLAGS
from relax.utils.flag_types import ConfigError
from tests.e2e_helpers import pretend_gpu_machine

BASE = ["--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--num-rollout", "1", "--hf-checkpoint", "tiny-qwen3",
        "--train-backend", "torch"]


@pytest.fixture
def sglang_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parse as on a GPU machine with sglang installed (CI has neither)."""
    pretend_gpu_machine(monkeypatch)
    monkeypatch.setattr(launcher, "sglang_available", lambda: True)


def test_the_pinned_list_is_sglangs_server_args_with_its_version() -> None:
    data = json.loads(PINNED.read_text())
    version, options = pinned()
    assert version == data["sglang_version"] == "0.5.14"
    fields = data["fields"]
    assert len(fields) > 300 and len(options) > 350  # every option spelling, aliases included
    # each option fills a ServerArgs field, but for a few that SGLang's parser handles itself (--config reads a
    # YAML file; two are read from the namespace by their consumers)
    cli_only = {o.dest for o in options.values()} - set(fields)
    assert cli_only <= {"config", "collect_tokens_histogram", "prefill_round_robin_balance"}
    assert set(RESERVED) <= set(fields)


def test_sglangs_renamed_options_still_work_through_their_deprecated_spellings() -> None:
    """0.5.14 renamed --disable-cuda-graph / --cuda-graph-max-bs and keeps the old names as Deprecated* actions."""
    assert server_arg_tokens({"disable_cuda_graph": True}) == ["--disable-cuda-graph"]
    assert server_arg_tokens({"cuda_graph_max_bs": 8}) == ["--cuda-graph-max-bs", "8"]
    assert server_arg_tokens({"cuda_graph_max_bs_decode": 8}) == ["--cuda-graph-max-bs-decode", "8"]


def test_every_sglang_flag_of_seed_000_is_a_server_args_option_or_relaxs_own() -> None:
    """A seed flag ``--sglang-X`` is SGLang's ``--X``, passed to its servers, except the profiling rows: those drive
    SGLang's /start_profile and /stop_profile from the rollout loop (relax/observability/sglang_profile.py)."""
    _, options = pinned()
    for spec in FLAGS:
        if not spec.name.startswith("sglang-"):
            continue
        name = spec.name.removeprefix("sglang-")
        assert spec.supported, spec.name
        assert (name in options) != name.startswith("profile"), spec.name


@pytest.mark.parametrize(("passthrough", "tokens"), [
    ({"mem_fraction_static": "0.7"}, ["--mem-fraction-static", "0.7"]),
    ({"disable_radix_cache": True}, ["--disable-radix-cache"]),
    ({"disable_radix_cache": "false"}, []),
    ({"cuda_graph_bs": "1 2 4"}, ["--cuda-graph-bs", "1", "2", "4"]),
    ({"cuda_graph_bs": [8, 16]}, ["--cuda-graph-bs", "8", "16"]),
    ({"deepep_mode": "low_latency"}, ["--deepep-mode", "low_latency"]),
    ({"fp8_gemm_backend": "auto"}, ["--fp8-gemm-backend", "auto"]),  # SGLang spells this field's flag its own way
])
def test_sglang_flags_become_sglangs_own_options(passthrough, tokens) -> None:
    assert server_arg_tokens(passthrough) == tokens


@pytest.mark.parametrize(("passthrough", "message"), [
    ({"mem_fraction": "0.7"}, "SGLang 0.5.14 has no option --mem-fraction .did you mean --sglang-mem-fraction-static"),
    ({"tp_size": "2"}, "--sglang-tp-size: set by --rollout-num-gpus-per-engine"),
    ({"model_path": "x"}, "--sglang-model-path: set by --hf-checkpoint"),
    ({"port": "1"}, "--sglang-port: set by the launcher"),
    ({"mem_fraction_static": "lots"}, "--sglang-mem-fraction-static 'lots': SGLang's --mem-fraction-static takes float"),
    ({"deepep_mode": "fast"}, "'fast': one of auto, normal, low_latency"),
    ({"disable_radix_cache": "maybe"}, "a switch, true or false"),
])
def test_bad_sglang_flags_are_refused_by_name(passthrough, message) -> None:
    with pytest.raises(ConfigError, match=message):
        server_arg_tokens(passthrough)


def test_launch_command_for_a_representative_set_of_flags(sglang_machine) -> None:
    args = parse_args([*BASE, "--device", "cuda", "--rollout-backend", "sglang",
                       "--offload-rollout", "--resource", '{"actor": [1, 1], "rollout": [1, 2]}',
                       "--rollout-num-gpus-per-engine", "2", "--seed", "40",
                       "--sglang-mem-fraction-static", "0.6", "--sglang-disable-radix-cache",
                       "--sglang-cuda-graph-max-bs", "64", "--sglang-log-level", "warning"])
    cmd = launcher.launch_command(SGLangLaunchConfig.from_args(args), engine_index=3, host="127.0.0.1", port=31000, nccl_port=31001, api_key="k",
                                  python="python3")
    assert cmd[:3] == ["python3", "-m", "sglang.launch_server"]
    pairs = {flag: cmd[cmd.index(flag) + 1] for flag in ("--model-path", "--tp-size", "--random-seed", "--host",
                                                        "--port", "--nccl-port", "--base-gpu-id", "--dtype", "--api-key")}
    assert pairs["--model-path"] == "tiny-qwen3" and pairs["--tp-size"] == "2" and pairs["--random-seed"] == "43"
    assert pairs["--host"] == "127.0.0.1" and pairs["--port"] == "31000" and pairs["--nccl-port"] == "31001"
    assert pairs["--base-gpu-id"] == "0" and pairs["--dtype"] == "float32" and pairs["--api-key"] == "k"
    assert "--enable-memory-saver" in cmd  # --offload-rollout releases engine memory between rollouts
    tail = cmd[cmd.index("--api-key") + 2:]
    assert tail == ["--mem-fraction-static", "0.6", "--disable-radix-cache", "--cuda-graph-max-bs", "64",
                    "--log-level", "warning"]


def test_list_options_take_every_value_up_to_the_next_flag(sglang_machine) -> None:
    flags = [*BASE, "--device", "cuda", "--rollout-backend", "sglang", "--sglang-cuda-graph-bs", "1", "2", "4"]
    args = parse_args([*flags, "--sglang-log-level", "warning"])
    assert args.sglang_passthrough["cuda_graph_bs"] == ["1", "2", "4"]
    cmd = launcher.launch_command(SGLangLaunchConfig.from_args(args), engine_index=0, host="127.0.0.1", port=31000, nccl_port=31001, api_key="k")
    assert cmd[cmd.index("--cuda-graph-bs"):][:5] == ["--cuda-graph-bs", "1", "2", "4", "--log-level"]
    with pytest.raises(ConfigError, match=r"^--sglang-log-level: SGLang's --log-level takes one value, got 2: warning info$"):
        parse_args([*flags, "--sglang-log-level", "warning", "info"])


def test_megatron_exports_bf16_and_no_offload_means_no_memory_saver(sglang_machine) -> None:
    args = parse_args([*BASE, "--device", "cuda", "--train-backend", "megatron", "--rollout-backend", "sglang"])
    cmd = launcher.launch_command(SGLangLaunchConfig.from_args(args), engine_index=0, host="127.0.0.1", port=1, nccl_port=2, api_key=None)
    assert cmd[cmd.index("--dtype") + 1] == "bfloat16" and "--enable-memory-saver" not in cmd
    assert "--api-key" not in cmd and cmd[cmd.index("--tp-size") + 1] == "1"


@pytest.mark.parametrize(("flags", "message"), [
    (["--rollout-backend", "sglang", "--device", "cpu"], "--device cpu has none"),
    (["--sglang-mem-fraction-static", "0.5"], "--sglang-mem-fraction-static configures SGLang servers: it needs "
                                              "--rollout-backend sglang"),
    (["--sglang-disable-radix-cache"], "--sglang-disable-radix-cache configures SGLang"),
    (["--rollout-num-gpus-per-engine", "2"], "not supported yet: --rollout-num-gpus-per-engine 2 with --rollout-backend "
                                             "embedded"),
    (["--rollout-backend", "sglang", "--device", "cuda", "--sglang-nope", "1"], "SGLang 0.5.14 has no option --nope"),
])
def test_engine_flag_rules(sglang_machine, flags, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_without_sglang_installed_the_backend_says_how_to_get_it(monkeypatch) -> None:
    pretend_gpu_machine(monkeypatch)
    monkeypatch.setattr(launcher, "sglang_available", lambda: False)
    with pytest.raises(ConfigError, match=r"needs SGLang: pip install 'sglang==0.5.14'.*RELAX_SGLANG_PYTHONPATH"):
        parse_args([*BASE, "--rollout-backend", "sglang", "--device", "cuda"])


def test_an_sglang_environment_of_its_own_is_on_the_servers_path_only(tmp_path, monkeypatch) -> None:
    """RELAX_SGLANG_PYTHONPATH: SGLang found there (not in relax's env), first on the server's PYTHONPATH."""
    monkeypatch.setenv("PYTHONPATH", "/relax/site")
    monkeypatch.setenv(launcher.SGLANG_PYTHONPATH, str(tmp_path))
    assert not launcher.sglang_available()  # nothing installed there yet
    (tmp_path / "sglang").mkdir()
    (tmp_path / "sglang" / "__init__.py").write_text("")
    assert launcher.sglang_available()
    assert launcher.server_env()["PYTHONPATH"] == f"{tmp_path}{os.pathsep}/relax/site"
    monkeypatch.delenv(launcher.SGLANG_PYTHONPATH)
    assert launcher.server_env()["PYTHONPATH"] == "/relax/site"


def test_a_model_preset_is_written_once_for_the_server_to_load(sglang_machine, tmp_path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    parsed = parse_args([*BASE, "--rollout-backend", "sglang", "--device", "cuda"])
    cfg = SGLangLaunchConfig.from_args(parsed).replace(hf_checkpoint="tiny-qwen3", output_dir=str(tmp_path),
                                                       train_backend="torch", bf16=False, seed=3)
    path = launcher.server_model_path(cfg)
    assert path == str(tmp_path / "sglang_model" / "tiny-qwen3")
    assert AutoConfig.from_pretrained(path).model_type == "qwen3"
    assert AutoTokenizer.from_pretrained(path)("12")["input_ids"]
    stamp = (Path(path) / "model.safetensors").stat().st_mtime_ns
    assert launcher.server_model_path(cfg) == path and (Path(path) / "model.safetensors").stat().st_mtime_ns == stamp
    cmd = launcher.launch_command(SGLangLaunchConfig.from_args(parsed), engine_index=0, host="127.0.0.1", port=1,
                                  nccl_port=2, api_key=None, model_path=path)
    assert cmd[cmd.index("--model-path") + 1] == path
    mine = cfg.replace(hf_checkpoint=str(tmp_path / "my-model"))  # a directory of the user's: passed as it is
    assert launcher.server_model_path(mine) == str(tmp_path / "my-model")


@pytest.mark.parametrize(("flags", "message"), [
    (["--rollout-external"], "--rollout-external needs --rollout-external-engine-addrs"),
    (["--rollout-external-engine-addrs", "127.0.0.1:1"], "has no effect without --rollout-external"),
    (["--rollout-external", "--rollout-external-engine-addrs", "127.0.0.1"], "'127.0.0.1': expected HOST:PORT"),
    (["--rollout-external", "--rollout-external-engine-addrs", "a:1", "a:1"], "names an engine twice"),
    (["--rollout-external", "--rollout-external-engine-addrs", "a:1", "--resource", '{"rollout": [2, 0]}'],
     "role 'rollout' with --rollout-external"),
    (["--rollout-external", "--rollout-external-engine-addrs", "a:1", "--sglang-disable-radix-cache"],
     "with --rollout-external: the run does not start those servers"),
    (["--rollout-external", "--rollout-external-engine-addrs", "a:1", "--weight-sync-transport", "tensor"],
     "tensor with --rollout-external"),
])
def test_external_engine_flag_rules(flags, message) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_args([*BASE, *flags])


def test_external_engine_addresses_parse() -> None:
    args = parse_args([*BASE, "--rollout-external", "--rollout-external-engine-addrs", "10.0.0.1:30000",
                       "http://127.0.0.1:30001"])
    assert args.rollout_external_engine_addrs == ["10.0.0.1:30000", "http://127.0.0.1:30001"]


def test_server_env_keeps_health_from_generating_and_nccl_cumem_equal_to_the_trainers(monkeypatch) -> None:
    """/health must not prefill on a server whose memory is released (it crashed SGLang 0.5.14 on an H200), and the
    server's NCCL cuMem switch is the Ray workers' (the trainer's) one."""
    from relax.distributed.cluster import worker_env

    monkeypatch.delenv("NCCL_CUMEM_ENABLE", raising=False)
    monkeypatch.delenv(launcher.HEALTH_GENERATION_ENV, raising=False)
    env = launcher.server_env()
    assert env[launcher.HEALTH_GENERATION_ENV] == "false"
    assert env["NCCL_CUMEM_ENABLE"] == worker_env()["NCCL_CUMEM_ENABLE"] == "0"
    monkeypatch.setenv("NCCL_CUMEM_ENABLE", "1")  # the user's choice, on both sides
    assert launcher.server_env()["NCCL_CUMEM_ENABLE"] == worker_env()["NCCL_CUMEM_ENABLE"] == "1"


def test_server_port_leaves_room_for_sglangs_grpc_port(monkeypatch) -> None:
    """SGLang 0.5.14 refuses --port above 55535 (its gRPC port is --port + 10000): an OS-drawn port above is redrawn."""
    drawn = iter([61234, 57445, 41000])

    class FakeSocket:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return False

        def bind(self, address):
            self.port = next(drawn)

        def getsockname(self):
            return ("0.0.0.0", self.port)

    monkeypatch.setattr(launcher.socket, "socket", FakeSocket)
    assert launcher._free_port() == 41000
    assert launcher.MAX_SERVER_PORT + 10000 == 65535


def test_a_colocated_engine_of_two_gpus_parses_and_its_server_sees_both(sglang_machine,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """--colocate with --rollout-num-gpus-per-engine 2: the engine spans both ranks' GPUs; its server process is
    given them (its actor holds a share of the first only)."""
    args = parse_args([*BASE, "--device", "cuda", "--rollout-backend", "sglang", "--colocate", "--resource",
                       '{"actor": [1, 2], "rollout": [1, 2]}', "--rollout-num-gpus-per-engine", "2"])
    assert args.rollout_num_gpus_per_engine == 2 and args.colocate
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # what Ray gives the engine's actor: its first bundle's GPU
    assert launcher.server_env(["3", "5"])["CUDA_VISIBLE_DEVICES"] == "3,5"
    assert launcher.server_env().get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")  # Ray's
