"""``--embedded-runner`` / ``--embedded-cuda-graph`` / ``--embedded-compile``: the auto rule
(relax/backends/embedded/runner_choice.py), the parse-time errors, the engine `EngineActor` builds,
and ``relax train`` on CPU with the lean and static runners (train/rollout log-prob mismatch < 1e-4,
the tolerance of tests/test_engine_core.py and tests/test_train_e2e.py)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from relax.backends.embedded import runner_choice as rc
from relax.backends.embedded.config import EmbeddedEngineConfig
from relax.backends.embedded.runner_choice import resolve_runner
from relax.utils.arguments import ConfigError, parse_args
from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

# requested, cuda_graph, compile, device -> (runner, cuda_graph, compile)
TABLE = [
    ("auto", None, False, "cuda", ("lean", True, False)),
    ("auto", None, True, "cuda", ("lean", True, True)),
    ("auto", False, False, "cuda", ("lean", False, False)),
    ("auto", True, False, "cuda:1", ("lean", True, False)),
    ("auto", None, False, "cpu", ("hf", False, False)),
    ("auto", False, False, "cpu", ("hf", False, False)),
    ("hf", None, False, "cuda", ("hf", False, False)),
    ("hf", False, False, "cuda", ("hf", False, False)),
    ("hf", None, False, "cpu", ("hf", False, False)),
    ("static", None, False, "cuda", ("static", True, False)),
    ("static", False, False, "cuda", ("static", False, False)),
    ("static", None, False, "cpu", ("static", False, False)),
    ("lean", None, False, "cuda", ("lean", True, False)),
    ("lean", None, True, "cuda", ("lean", True, True)),
    ("lean", False, True, "cuda", ("lean", False, True)),
    ("lean", None, False, "cpu", ("lean", False, False)),
]

# requested, cuda_graph, compile, device -> part of the one-line error
ERRORS = [
    ("auto", True, False, "cpu", "--embedded-cuda-graph needs a CUDA device"),
    ("lean", True, False, "cpu", "--embedded-cuda-graph needs a CUDA device"),
    ("auto", None, True, "cpu", "--embedded-compile needs a CUDA device"),
    ("lean", None, True, "cpu", "--embedded-compile needs a CUDA device"),
    ("hf", True, False, "cuda", "needs --embedded-runner static or lean"),
    ("hf", None, True, "cuda", "--embedded-compile needs --embedded-runner lean"),
    ("static", None, True, "cuda", "--embedded-compile needs --embedded-runner lean"),
    ("fast", None, False, "cuda", "choose one of auto, hf, static, lean"),
]


@pytest.mark.parametrize(("requested", "graph", "compile_", "device", "expected"), TABLE)
def test_auto_resolution_table(requested, graph, compile_, device, expected) -> None:
    choice = resolve_runner(requested, graph, compile_, device)
    assert (choice.runner, choice.cuda_graph, choice.compile) == expected
    assert choice.why == ""


@pytest.mark.parametrize(("requested", "graph", "compile_", "device", "match"), ERRORS)
def test_impossible_combinations_raise_one_line(requested, graph, compile_, device, match) -> None:
    with pytest.raises(ValueError, match=match) as exc:
        resolve_runner(requested, graph, compile_, device)
    assert "\n" not in str(exc.value)


def test_auto_falls_back_to_hf_when_the_kv_cache_does_not_fit() -> None:
    choice = resolve_runner("auto", None, False, "cuda", kv_cache_fits=False)
    assert (choice.runner, choice.cuda_graph) == ("hf", False) and "--rollout-max-context-len" in choice.why
    for requested, graph, compile_ in [("lean", None, False), ("static", None, False), ("auto", True, False),
                                       ("auto", None, True)]:
        with pytest.raises(ValueError, match="set --rollout-max-context-len"):
            resolve_runner(requested, graph, compile_, "cuda", kv_cache_fits=False)
    assert resolve_runner("hf", None, False, "cuda", kv_cache_fits=False).runner == "hf"  # allocates as it goes


BASE = ["--preset", "quickstart"]


def test_flags_parse_with_documented_defaults() -> None:
    args = parse_args(BASE)
    assert (args.embedded_runner, args.embedded_cuda_graph, args.embedded_compile) == ("auto", None, False)
    args = parse_args([*BASE, "--embedded-runner", "lean", "--embedded-cuda-graph", "false"])
    assert (args.embedded_runner, args.embedded_cuda_graph) == ("lean", False)


@pytest.mark.parametrize(("extra", "match"), [
    (["--embedded-cuda-graph"], "--embedded-cuda-graph needs a CUDA device"),
    (["--embedded-cuda-graph", "true", "--embedded-runner", "lean"], "--embedded-cuda-graph needs a CUDA device"),
    (["--embedded-compile"], "--embedded-compile needs a CUDA device"),
    (["--embedded-runner", "static", "--embedded-compile", "--device", "cuda"], "needs --embedded-runner lean"),
    (["--embedded-runner", "turbo"], "invalid choice"),
])
def test_cli_errors_are_config_errors(extra: list[str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        parse_args([*BASE, *extra])  # the quickstart preset says --device cpu


def test_cpu_auto_device_checks_cuda_only_when_graphs_or_compile_are_asked(monkeypatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = parse_args([*BASE, "--device", "auto", "--embedded-cuda-graph", "--embedded-compile"])
    assert args.embedded_cuda_graph is True and args.embedded_compile
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ConfigError, match="needs a CUDA device"):
        parse_args([*BASE, "--device", "auto", "--embedded-cuda-graph"])


def _fake_model(preset: str, dtype: torch.dtype) -> SimpleNamespace:
    from relax.models import build_config

    return SimpleNamespace(config=build_config(preset), parameters=lambda: iter([torch.zeros(1, dtype=dtype)]))


def test_engine_kwargs_size_the_kv_cache_for_one_rollout_step(monkeypatch) -> None:
    from relax.backends.embedded import lean_runner

    monkeypatch.setattr(rc, "_memory_budget", lambda device: int(0.25 * 80 * 2**30))  # an 80 GB GPU
    monkeypatch.setattr(lean_runner, "unsupported", lambda model: [])  # a config without modules: a dense Qwen3
    flags = ["--hf-checkpoint", "bench-270m", "--rollout-batch-size", "8", "--n-samples-per-prompt", "8",
             "--device", "cuda"]
    model = _fake_model("bench-270m", torch.bfloat16)
    # the model's 32768 positions x 64 slots would be 64 GiB of bf16 KV cache: auto keeps hf
    assert rc.engine_runner_kwargs(EmbeddedEngineConfig.from_args(parse_args([*BASE, *flags])), "cuda", model) == {
        "runner": "hf", "cuda_graph": False, "compile": False}
    with pytest.raises(ValueError, match="--rollout-max-context-len"):
        rc.engine_runner_kwargs(EmbeddedEngineConfig.from_args(parse_args([*BASE, *flags, "--embedded-runner", "lean"])), "cuda", model)
    fits = parse_args([*BASE, *flags, "--rollout-max-context-len", "384", "--embedded-compile"])
    assert rc.engine_runner_kwargs(EmbeddedEngineConfig.from_args(fits), "cuda", model) == {
        "runner": "lean", "cuda_graph": True, "compile": True, "max_running_requests": 64}
    assert rc.kv_cache_bytes(model.config, 64, 384, 2) == 2 * 16 * 8 * 64 * 2 * 64 * 384


@pytest.mark.parametrize(("runner", "cls"), [("auto", "HFRunner"), ("static", "StaticRunner"), ("lean", "LeanRunner")])
def test_engine_actor_builds_the_chosen_runner_on_cpu(runner: str, cls: str) -> None:
    from relax.distributed.engine_actor import build_engine

    engine = build_engine(EmbeddedEngineConfig.from_args(parse_args([*BASE, "--embedded-runner", runner])), "cpu")
    assert type(engine.runner).__name__ == cls
    # static/lean hold one slot per sample of a rollout step (quickstart: 32 prompts x 8)
    assert engine.max_running_requests == 256
    assert not getattr(engine.runner, "cuda_graph", False)


@pytest.mark.ray
@pytest.mark.parametrize("runner", ["lean"])  # static shares the plumbing; its engine tests: test_engine_core.py
def test_relax_train_on_cpu_with_runner(runner: str, tmp_path: Path) -> None:
    proc = run_relax([*FAST_FLAGS, "--num-rollout", "2", "--rollout-max-response-len", "4", "--embedded-runner", runner,
                      "--output-dir", str(tmp_path / "run")], tmp_path)
    assert_ok(proc)
    metrics = read_jsonl(tmp_path / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:  # every step: the engine's log-probs are the trainer's, after each weight sync
        assert m["train/train_rollout_logprob_abs_diff"] < 1e-4, m
        assert m["rollout/response_len_mean"] > 1  # decode steps ran, not only the prefill's token
    weights = read_jsonl(tmp_path / "run" / "weights.jsonl")
    for version in range(3):
        sides = {r["side"]: r["checksums"] for r in weights if r["version"] == version}
        assert sides["engine:0"] == sides["trainer"], version


def test_auto_falls_back_to_hf_for_a_model_the_lean_runner_cannot_run() -> None:
    from relax.backends.embedded.lean_runner import unsupported
    from relax.models import build_model

    refuses = ", ".join(unsupported(build_model("small-qwen3-moe")))
    assert refuses == "MLP without gate/up/down projections" and not unsupported(build_model("small-qwen3"))
    choice = resolve_runner("auto", None, False, "cuda", lean_refuses=refuses)
    assert (choice.runner, choice.cuda_graph) == ("hf", False) and refuses in choice.why
    with pytest.raises(ValueError, match="does not support this model"):
        resolve_runner("auto", True, False, "cuda", lean_refuses=refuses)
