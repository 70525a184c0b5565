"""CPU checks of ci/bench_megatron.py: arguments, the MFU formula, the table, the relax flags it
builds, OOM fallback, the checksum checks, and a smoke run of the whole script with the torch
backend on tiny-qwen3 (the GPU run is the same code with ``--train-backend megatron``)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch

from ci import bench_megatron as bm
from relax.models import PRESETS, build_config, param_count

CPU_SMOKE = ["--train-backend", "torch", "--device", "cpu", "--model", "tiny-qwen3", "--seq-len", "32",
             "--global-batch", "8", "--micro-batch", "4", "--warmup", "1", "--steps", "1", "--sync-repeats", "1"]


# ------------------------------------------------------------------ arguments
def test_defaults_are_the_1b_config_sized_for_80gb() -> None:
    ns = bm.parse([])
    assert (ns.model, ns.seq_len, ns.prompt_len, ns.global_batch, ns.micro_batch) == ("bench-1b", 2048, 512, 16, 8)
    assert (ns.warmup, ns.steps, ns.sync_repeats, ns.peak_tflops) == (2, 3, 3, 989.0)
    assert ns.train_backend == "megatron" and ns.device == "cuda" and not ns.no_distributed_optimizer


def test_quick_uses_the_smaller_config_and_explicit_flags_win() -> None:
    ns = bm.parse(["--quick"])
    assert (ns.model, ns.seq_len, ns.global_batch, ns.micro_batch, ns.warmup, ns.steps, ns.sync_repeats) == (
        "bench-270m", 1024, 8, 4, 1, 2, 2)
    ns = bm.parse(["--quick", "--seq-len", "512", "--steps", "5"])
    assert (ns.seq_len, ns.prompt_len, ns.steps) == (512, 128, 5)
    ns = bm.parse(["--quick", "--model", "qwen3-0.5b"])  # quick step counts, the model's own shape
    assert (ns.model, ns.seq_len, ns.global_batch, ns.steps) == ("qwen3-0.5b", 2048, 16, 2)


@pytest.mark.parametrize("argv", [
    ["--model", "gpt-9"],
    ["--global-batch", "12"],
    ["--global-batch", "0"],
    ["--micro-batch", "32"],
    ["--micro-batch", "0"],
    ["--seq-len", "128", "--prompt-len", "128"],
    ["--prompt-len", "0"],
    ["--steps", "0"],
    ["--peak-tflops", "0"],
    ["--skip", "everything"],
])
def test_bad_arguments_exit_with_a_message(argv: list[str], capsys) -> None:
    with pytest.raises(SystemExit) as exc:
        bm.parse(argv)
    assert exc.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_preflight_explains_what_is_missing(monkeypatch) -> None:
    assert bm.preflight(bm.parse(CPU_SMOKE)) is None
    assert "megatron-core does not run on CPU" in bm.preflight(bm.parse(["--device", "cpu"]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "needs a CUDA GPU" in bm.preflight(bm.parse([]))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("relax.backends.megatron.checks.module_available", lambda name: False)
    assert "PYTHONPATH" in bm.preflight(bm.parse([]))


def test_backend_flags_parse_as_relax_train_flags(monkeypatch, tmp_path) -> None:
    from relax.utils.arguments import parse_args

    # flag translation only: pretend the GPU machine's CUDA and megatron-core are here
    monkeypatch.setattr("relax.backends.megatron.checks._cuda_available", lambda: True)
    monkeypatch.setattr("relax.backends.megatron.checks.module_available", lambda name: True)
    ns = bm.parse(["--global-batch", "32", "--micro-batch", "2", "--seq-len", "4096"])
    args = parse_args(bm.backend_argv(ns, str(tmp_path)))
    assert args.train_backend == "megatron" and args.use_distributed_optimizer
    assert (args.global_batch_size, args.micro_batch_size) == (32, 2)
    assert args.rollout_batch_size * args.n_samples_per_prompt == 32  # one optimizer step per train_rollout
    assert args.hf_checkpoint == "bench-1b" and args.rollout_max_response_len == 4096 - 1024
    assert not (args.use_kl_loss or args.kl_loss_coef or args.kl_coef)  # no reference model in the timing
    assert not (args.no_bias_swiglu_fusion or args.no_bias_dropout_fusion or args.no_rope_fusion)  # fused
    plain = parse_args(bm.backend_argv(bm.parse(["--no-distributed-optimizer", "--unfused"]), str(tmp_path)))
    assert not plain.use_distributed_optimizer and plain.no_bias_swiglu_fusion and plain.no_bias_dropout_fusion
    assert plain.no_rope_fusion
    torch_args = parse_args(bm.backend_argv(bm.parse(CPU_SMOKE), str(tmp_path)))  # no Megatron-only flag
    assert torch_args.train_backend == "torch" and not torch_args.use_distributed_optimizer


# ------------------------------------------------------------------ FLOPs
@pytest.mark.parametrize("name", sorted(n for n, p in PRESETS.items() if p.family in ("qwen3", "qwen2", "llama")))
def test_flop_model_counts_every_dense_preset_parameter(name: str) -> None:
    cfg = build_config(name)
    fm = bm.FlopModel.from_hf_config(cfg)
    assert fm.total_params == param_count(name)
    embed = cfg.vocab_size * cfg.hidden_size
    assert fm.matmul_params == fm.total_params - (0 if cfg.tie_word_embeddings else embed)


def test_flop_model_refuses_a_mixture_of_experts() -> None:
    with pytest.raises(ValueError, match="counts dense decoders; qwen3_moe"):
        bm.FlopModel.from_hf_config(build_config("small-qwen3-moe"))


def test_bench_1b_is_about_1b_and_the_formula_is_the_stated_one() -> None:
    fm = bm.FlopModel.from_hf_config(build_config("bench-1b"))
    assert (fm.layers, fm.attn_width) == (18, 16 * 128)
    assert 1.0e9 < fm.total_params < 1.1e9 and fm.matmul_params == fm.total_params - 32000 * 2048
    n, s = fm.matmul_params, 2048
    assert fm.train_flops_per_token(s) == 6 * n + 12 * 18 * 2048 * s
    assert fm.rl_step_flops_per_token(s) == 8 * n + 16 * 18 * 2048 * s
    assert fm.forward_flops_per_token(s) == 2 * n + 4 * 18 * 2048 * s
    # causal: half of the s x s scores, in float64 from the formula's own terms
    assert fm.forward_flops_per_token(s, causal=True) == 2 * n + 2 * 18 * 2048 * s
    assert fm.rl_step_flops_per_token(s, causal=True) == 8 * n + 8 * 18 * 2048 * s
    assert fm.train_flops_per_token(s, True) == 6 * n + 6 * 18 * 2048 * s
    # 1e12 FLOPs per token x 1000 tokens in 2 s on a 1000 TFLOP/s device = 50%
    assert bm.mfu(1e12, 1000, 2.0, 1000.0) == pytest.approx(0.5)


def test_qwen2_qkv_bias_is_counted() -> None:
    import transformers as tf

    cfg = tf.Qwen2Config(vocab_size=100, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True)
    with torch.device("meta"):
        model = tf.Qwen2ForCausalLM(cfg)
    assert bm.FlopModel.from_hf_config(cfg).total_params == sum(p.numel() for p in model.parameters())


# ------------------------------------------------------------------ table
def test_table_is_one_aligned_markdown_table() -> None:
    rows = [bm.Row("RL step MFU", 0.4321, "%", ">= 40%", True, "x"),
            bm.Row("sync direct GPU tensors", 0.0123, "s/GB", "<= 0.05", True),
            bm.Row("tokens/s", 123456.7, "tok/s"),
            bm.Row("LM loss MFU", None, "%", ">= 40%", None, "FAILED (see log)"),
            bm.Row("  tensors unequal", 3.0, "tensors", "0", False)]
    text = bm.format_table(["title line"], rows)
    lines = text.splitlines()
    assert lines[0] == "title line" and lines[1] == ""
    table = lines[2:]
    assert len(table) == 2 + len(rows)
    assert len({len(line) for line in table}) == 1  # every line the same width
    assert table[1].startswith("|---") and ":|" in table[1]  # value column right-aligned
    assert "43.2%" in table[2] and "met" in table[2]
    assert "0.0123" in table[3] and "123,457" in table[4]
    cells = [c.strip() for c in table[5].strip("|").split("|")]
    assert cells[:3] == ["LM loss MFU", "-", ""] and cells[-1] == "FAILED (see log)"
    cells = [c.strip() for c in table[6].strip("|").split("|")]
    assert cells[1:5] == ["3", "tensors", "0", "MISSED"]


def test_row_value_text() -> None:
    assert bm.Row("a", None, "%").value_text() == "-"
    assert bm.Row("a", 0.05, "%").value_text() == "5.0%"
    assert bm.Row("a", 2.0, "tensors").value_text() == "2"
    assert bm.Row("a", 12345.6, "tok/s").value_text() == "12,346"
    assert bm.Row("a", 3.14159, "s").value_text() == "3.14"
    assert bm.Row("a", 0.012345, "s/GB").value_text() == "0.0123"
    assert [bm.Row("a", 1, "", "", ok).status() for ok in (True, False, None)] == ["met", "MISSED", ""]


# ------------------------------------------------------------------ helpers
def test_samples_are_full_length_with_reward_spread() -> None:
    a = bm.make_samples(16, 64, 16, 100, seed=3)
    b = bm.make_samples(16, 64, 16, 100, seed=3)
    assert [s.tokens for s in a] == [s.tokens for s in b]
    assert all(len(s.tokens) == 64 and s.response_length == 48 and sum(s.loss_mask) == 48 for s in a)
    assert all(3 <= t < 100 for s in a for t in s.tokens)
    for g in range(0, 16, bm.GROUP):  # every GRPO group has both rewards, so advantages are non-zero
        assert {s.reward for s in a[g : g + bm.GROUP]} == {0.0, 1.0}


def test_time_steps_runs_warmup_untimed() -> None:
    calls = []
    times = bm.time_steps(calls.append, warmup=2, steps=3, device="cpu")
    assert calls == [0, 1, 2, 3, 4] and len(times) == 3 and all(t >= 0 for t in times)


@dataclass(frozen=True)
class _FakeTrainerConfig:
    micro_batch_size: int


def _fake_backend(train_rollout, micro_batch: int = 8) -> SimpleNamespace:
    return SimpleNamespace(cfg=_FakeTrainerConfig(micro_batch), hf_config=SimpleNamespace(vocab_size=50),
                           train_rollout=train_rollout, device="cpu")


def test_out_of_memory_halves_the_micro_batch_and_retries() -> None:
    backend = None

    def train_rollout(samples, step):
        if backend.cfg.micro_batch_size > 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return {"train/grad_norm": 1.0}

    backend = _fake_backend(train_rollout)
    ns = bm.parse([*CPU_SMOKE, "--skip", "policy", "lm"])
    fm = bm.FlopModel.from_hf_config(build_config("tiny-qwen3"))
    res = bm.run_train_rows(backend, ns, fm)
    assert res.micro_batch == 2 and not res.failures
    assert [r.name for r in res.rows] == ["RL step (train_rollout) tokens/s", "RL step (train_rollout) MFU",
                                          "RL step (train_rollout) MFU, causal attention"]
    full, causal = res.rows[1].value, res.rows[2].value
    assert full / causal == pytest.approx(fm.rl_step_flops_per_token(ns.seq_len)
                                          / fm.rl_step_flops_per_token(ns.seq_len, causal=True))


def test_rl_step_without_the_old_log_prob_forward_counts_three_forwards() -> None:
    """When train_rollout took the old log-probs from the step's own forward, its FLOPs are fwd + bwd (3 F), not 4 F."""
    ns = bm.parse([*CPU_SMOKE, "--skip", "policy", "lm"])
    fm = bm.FlopModel.from_hf_config(build_config("tiny-qwen3"))
    times = []
    for from_step in (0.0, 1.0):
        backend = _fake_backend(lambda samples, step, f=from_step: {"train/grad_norm": 1.0,
                                                                     "train/old_log_probs_from_step": f})
        rows = bm.run_train_rows(backend, ns, fm).rows
        times.append((rows[1].value, rows[1].note))
    (four, note4), (three, note3) = times
    assert "8N+16Lhs" in note4 and "6N+12Lhs" in note3
    assert fm.rl_step_flops_per_token(ns.seq_len, old_forward=False) == fm.train_flops_per_token(ns.seq_len)


def test_other_failures_are_reported_in_the_table_not_raised() -> None:
    def nan_step(samples, step):
        return {"train/grad_norm": float("nan")}

    ns = bm.parse([*CPU_SMOKE, "--skip", "policy", "lm"])
    res = bm.run_train_rows(_fake_backend(nan_step), ns, bm.FlopModel.from_hf_config(build_config("tiny-qwen3")))
    assert len(res.failures) == 1 and "non-finite grad norm" in res.failures[0]
    assert res.rows[0].value is None and "FAILED" in res.rows[0].note


def test_a_sync_that_skips_a_tensor_is_caught(tmp_path) -> None:
    from relax.backends.embedded.engine import EmbeddedEngine

    ns = bm.parse(CPU_SMOKE)
    backend = bm.build_backend(ns, str(tmp_path))

    class Lossy(EmbeddedEngine):
        def update_weights_from_tensors(self, named_tensors, version=None):
            return super().update_weights_from_tensors([(n, t) for n, t in named_tensors if n != "model.norm.weight"],
                                                       version=version)

    good = bm.run_sync_rows(backend, bm.build_engine(ns), ns)
    assert good.checksums_equal == {"via CPU buckets": True, "direct GPU tensors": True} and not good.failures
    engine = bm.build_engine(ns)
    lossy = bm.run_sync_rows(backend, Lossy(engine.model, eos_token_ids=[], device="cpu"), ns)
    assert lossy.checksums_equal == {"via CPU buckets": False, "direct GPU tensors": False}
    assert len(lossy.failures) == 2 and "model.norm.weight" in lossy.failures[0]
    unequal = [r for r in lossy.rows if "tensors unequal" in r.name]
    assert [r.value for r in unequal] == [1.0, 1.0] and not any(r.ok for r in unequal)


# ------------------------------------------------------------------ the whole script (torch backend, CPU)
def test_cpu_smoke_run_prints_one_table_and_writes_json(tmp_path, capsys) -> None:
    out = tmp_path / "bench.json"
    assert bm.main([*CPU_SMOKE, "--json", str(out)]) == 0
    stdout = capsys.readouterr().out
    table = [line for line in stdout.splitlines() if line.startswith("|")]
    assert len(table) == 2 + 15 and stdout.count("| measurement") == 1
    data = json.loads(out.read_text())
    names = [r["name"] for r in data["rows"]]
    for expected in ("RL step (train_rollout) MFU", "policy update (fwd+bwd+Adam) MFU", "LM loss (fwd+bwd+Adam) MFU",
                     "RL step (train_rollout) MFU, causal attention", "LM loss (fwd+bwd+Adam) MFU, causal attention",
                     "sync via CPU buckets", "sync direct GPU tensors", "wall time of this script"):
        assert expected in names
    assert data["failures"] == [] and data["setup"]["micro_batch_used"] == 4
    assert {"command", "commit", "machine"} <= set(data["provenance"])  # every figure traceable to its run
    unequal = [r for r in data["rows"] if "tensors unequal" in r["name"]]
    assert len(unequal) == 2 and all(r["value"] == 0 and r["ok"] for r in unequal)


def test_script_refuses_a_machine_it_cannot_run_on(capsys) -> None:
    assert bm.main(["--device", "cpu"]) == 2
    assert "megatron-core does not run on CPU" in capsys.readouterr().err


def test_nox_bench_session_runs_both_benches_and_keeps_engine_arguments(monkeypatch) -> None:
    import importlib
    import sys
    from pathlib import Path

    try:
        import nox  # noqa: F401
    except ImportError:  # nox lives outside the test venv: a stub is enough to import the noxfile
        stub = SimpleNamespace(options=SimpleNamespace(), session=lambda *a, **k: (lambda fn: fn))
        monkeypatch.setitem(sys.modules, "nox", stub)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1]))
    monkeypatch.delitem(sys.modules, "noxfile", raising=False)
    noxfile = importlib.import_module("noxfile")

    engine, megatron = ["python3", "ci/bench_engine.py"], ["python3", "ci/bench_megatron.py"]
    grpo = ["python3", "ci/bench_grpo_e2e.py"]
    assert noxfile.bench_commands([]) == [engine, megatron, grpo]
    assert noxfile.bench_commands(["--batches", "32"]) == [[*engine, "--batches", "32"], megatron, grpo]
    assert noxfile.bench_commands(["grpo", "--quick"]) == [[*grpo, "--quick"]]
    assert noxfile.bench_commands(["megatron", "--quick"]) == [[*megatron, "--quick"]]
    assert noxfile.bench_commands(["engine", "--new", "64"]) == [[*engine, "--new", "64"]]


def test_profile_prints_the_costliest_ops_of_one_rl_step(capsys) -> None:
    assert bm.main([*CPU_SMOKE, "--skip", "policy", "lm", "sync", "--profile", "5"]) == 0
    err = capsys.readouterr().err
    assert "profile of one RL step, top 5 by self_cpu_time_total" in err and "Self CPU" in err
