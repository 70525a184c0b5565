"""Seed 004's launch script, ported as its migration guide says, on a tiny CPU model.

The flags are the template's (CKPT/ROLLOUT/PERF/GRPO/OPTIMIZER/SGLANG/LOG/MISC/EVAL arrays and both
launch branches), with sizes shrunk and paths pointing at a verl dataset converted by ``relax
convert-data`` and at HF checkpoints the test builds (a real byte-level BPE tokenizer with a ChatML
template). With every flag: the ones that need GPUs are refused, all in one run, each by the check
that names the missing GPU, and nothing else is. Without those: the colocate branch trains a Qwen2
directory in bf16 and the fully-async branch (with its reference / actor_fwd / advantages services)
a Llama directory, both through the multi-turn environment of examples/arith_env (its turns checked
in every reward call: distinct sampling seeds, observations masked), then export with ``--save-hf``,
and the exports load back with transformers holding exactly the weights of the last sync.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relax.utils.flag_table import FLAGS
from tests.e2e_helpers import assert_ok, read_jsonl, run_relax
from tests.hf_dirs import arithmetic_corpus, bpe_tokenizer, hf_dir, model_flags

REPO = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.ray]

# PERF_ARGS / OPTIMIZER_ARGS / SGLANG_ARGS / MISC_ARGS entries of seed 004's template that need GPUs
GPU_FLAGS = [
    "--tensor-model-parallel-size", "4", "--sequence-parallel", "--recompute-granularity", "full",
    "--recompute-method", "uniform", "--recompute-num-layers", "1", "--optimizer-cpu-offload",
    "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer", "--rollout-num-gpus-per-engine", "2",
    "--sglang-mem-fraction-static", "0.8", "--megatron-to-hf-mode", "bridge", "--attention-backend", "flash",
]
GPU_REFUSED = ["--tensor-model-parallel-size 4", "--sequence-parallel", "--recompute-granularity full",
               "--recompute-method uniform", "--recompute-num-layers 1", "--optimizer-cpu-offload",
               "--overlap-cpu-optimizer-d2h-h2d", "--use-precision-aware-optimizer", "--rollout-num-gpus-per-engine 2",
               "--sglang-mem-fraction-static 0.8", "--megatron-to-hf-mode bridge", "--attention-backend flash"]
COLOCATE = ["--resource", '{"actor": [1, 8], "rollout": [1, 8]}', "--max-staleness", "1", "--num-data-storage-units",
            "1", "--colocate", "--use-health-check", "--balance-data"]
FULLY_ASYNC = ["--resource", '{"actor": [1, 4], "rollout": [1, 2], "reference": [1, 1], "actor_fwd": [1, 1], '
               '"advantages": [1, 0]}', "--max-staleness", "3", "--num-data-storage-units", "1",
               "--num-iters-per-train-update", "8", "--ref-actor-config",
               '{"tensor_model_parallel_size": 1, "max_tokens_per_gpu": 16384, "sequence_parallel": false, '
               '"only_load_weight": true}', "--fully-async", "--use-health-check"]


def _verl_parquet(path: Path) -> Path:
    """A verl RL dataset: chat-message prompts, reward_model.ground_truth, data_source, extra_info."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = []
    for i, (a, b) in enumerate((a, b) for a in range(4) for b in range(4)):
        c = (a * 3 + b) % 10
        rows.append({"data_source": "arith", "prompt": [{"role": "user", "content": f"{a}+{b}="}],
                     "ability": "math", "reward_model": {"style": "rule", "ground_truth": f"{(a + b) % 10},{(a + b + c) % 10}"},
                     "extra_info": {"index": i, "addends": [c]}})
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


@pytest.fixture(scope="module")
def recipe(tmp_path_factory) -> dict[str, Path]:
    """The user's inputs: converted data, a Qwen2 and a Llama checkpoint directory."""
    root = tmp_path_factory.mktemp("recipe")
    verl = _verl_parquet(root / "verl_train.parquet")
    converted = root / "train.parquet"
    proc = subprocess.run([sys.executable, "-m", "relax.cli", "convert-data", str(verl), str(converted)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    tok = bpe_tokenizer(arithmetic_corpus())
    return {"data": converted, "qwen2": hf_dir(root / "Qwen2-tiny", "qwen2", tok, seed=1),
            "llama": hf_dir(root / "Llama-tiny", "llama", tok, seed=2), "tokenizer": tok}


def _launch(recipe: dict, family: str, out: Path, mode: list[str], extra: list[str] = ()) -> list[str]:
    model = str(recipe[family])
    data = str(recipe["data"])
    return [
        *model_flags(family, recipe["tokenizer"]),  # MODEL_ARGS, as a scripts/models/*.sh would give them
        "--hf-checkpoint", model, "--ref-load", model, "--save-hf", str(out / "hf"),  # CKPT_ARGS
        "--prompt-data", json.dumps([data]), "--input-key", "prompt", "--label-key", "label",  # ROLLOUT_ARGS
        "--metadata-key", "extra_info", "--reward-key", "score", "--apply-chat-template",
        "--custom-rm-path", "tests.recipe_hooks.checked_arith_reward",
        "--custom-generate-function-path", "examples.arith_env.rollout.generate",
        "--custom-config-path", str(REPO / "examples/arith_env/arith_config.yaml"),
        "--num-rollout", "2", "--rollout-batch-size", "4", "--n-samples-per-prompt", "4",
        "--rollout-max-response-len", "16", "--rollout-max-prompt-len", "64", "--rollout-temperature", "1",
        "--global-batch-size", "16", "--rollout-shuffle", "--use-fault-tolerance",
        "--pipeline-model-parallel-size", "1", "--context-parallel-size", "1",  # PERF_ARGS
        "--expert-model-parallel-size", "1", "--expert-tensor-parallel-size", "1", "--micro-batch-size", "1",
        "--max-tokens-per-gpu", "9216",
        "--advantage-estimator", "grpo", "--use-kl-loss", "--kl-loss-coef", "0.001",  # GRPO_ARGS
        "--kl-loss-type", "low_var_kl", "--entropy-coef", "0", "--eps-clip", "0.2", "--eps-clip-high", "0.28",
        "--use-tis",
        "--optimizer", "adam", "--lr", "1e-6", "--lr-decay-style", "constant", "--weight-decay", "0.1",  # OPTIMIZER
        "--adam-beta1", "0.9", "--adam-beta2", "0.98", "--clip-grad", "1.0",
        "--use-tensorboard", "--use-metrics-service", "--tb-project-name", str(out / "tb"),  # LOG_ARGS
        "--tb-experiment-name", "exp",
        "--attention-dropout", "0.0", "--hidden-dropout", "0.0", "--accumulate-allreduce-grads-in-fp32",  # MISC
        "--attention-softmax-in-fp32",
        "--eval-interval", "100", "--eval-prompt-data", "arith", data, "--n-samples-per-eval-prompt", "1",  # EVAL
        *mode, *extra, "--output-dir", str(out / "run"),
    ]


@pytest.fixture(autouse=True)
def _recipe_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    """Recipes live in examples/ and tests/ of the repository (seed 004: run from its root)."""
    monkeypatch.setenv("PYTHONPATH", f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")


def test_gpu_flags_are_refused_by_the_gpu_check_only_all_in_one_run(recipe, tmp_path, capsys) -> None:
    from relax.entrypoints.train import main

    for mode in (COLOCATE, FULLY_ASYNC):
        assert main(_launch(recipe, "qwen2", tmp_path, mode, GPU_FLAGS)) == 2
        lines = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(lines) == len(GPU_REFUSED), lines
        order = {f"--{spec.name}": i for i, spec in enumerate(FLAGS)}
        for line, flag in zip(lines, sorted(GPU_REFUSED, key=lambda f: order[f.split()[0]]), strict=True):
            assert line.startswith(f"relax: {flag} needs a CUDA GPU (") and line.endswith("this machine has none"), line


def _exported_weights_equal_last_sync(run: Path, export: Path, dtype) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from relax.weights.checksum import state_checksums

    model = AutoModelForCausalLM.from_pretrained(export, local_files_only=True, dtype=dtype)
    records = read_jsonl(run / "weights.jsonl")
    last = max(r["version"] for r in records)
    trainer = next(r for r in records if r["version"] == last and r["side"] == "trainer")
    state = model.state_dict()
    assert all(t.dtype == dtype for t in state.values())
    ours = state_checksums(state.items())
    assert {k: ours[k] for k in trainer["checksums"]} == trainer["checksums"]
    assert torch.isfinite(next(iter(state.values()))).all()


def _check_run(out: Path, proc, *, fully_async: bool) -> list[dict]:
    assert_ok(proc)
    assert "Traceback" not in proc.stderr
    assert "notice: the default --train-backend megatron needs a CUDA GPU" in proc.stdout
    metrics = read_jsonl(out / "run" / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [0, 1]
    for m in metrics:
        # two turns of one digit and the "+c=" observation between them; the observation carries no loss
        assert m["rollout/response_len_mean"] > m["rollout/reward_extra/turns"]
        assert m["train/train_rollout_logprob_abs_diff"] < 0.05  # only model tokens are compared
        assert m["train/num_optimizer_steps"] == (8 if fully_async else 1)
    assert "eval/arith/reward_mean" in metrics[0]  # the custom generate function ran the eval too
    trained = [s for s in read_jsonl(out / "run" / "samples.jsonl") if s["fate"] == "trained"]
    assert len(trained) == 32 and all(s["reward"] is not None for s in trained)
    assert any(s["response_length"] > s["loss_tokens"] > 0 for s in trained)
    return metrics


def test_colocate_branch_trains_qwen2_bf16_and_exports(recipe, tmp_path) -> None:
    import torch

    proc = run_relax(_launch(recipe, "qwen2", tmp_path, COLOCATE, ["--bf16"]), tmp_path,
                     private_cluster=True)  # its 8 GPUs are logical: a private cluster reserves them
    _check_run(tmp_path, proc, fully_async=False)
    info = json.loads((tmp_path / "run" / "run.json").read_text())
    assert info["config"]["train_backend"] == "torch" and info["config"]["bf16"] is True
    assert "dtype': 'bfloat16'" in proc.stdout
    _exported_weights_equal_last_sync(tmp_path / "run", tmp_path / "hf", torch.bfloat16)


def test_fully_async_branch_trains_llama_with_services_and_exports(recipe, tmp_path) -> None:
    import torch

    proc = run_relax(_launch(recipe, "llama", tmp_path, FULLY_ASYNC), tmp_path, private_cluster=True)
    _check_run(tmp_path, proc, fully_async=True)
    assert {r["side"] for r in read_jsonl(tmp_path / "run" / "weights.jsonl")} >= {"trainer", "engine:0", "actor_fwd:0"}
    _exported_weights_equal_last_sync(tmp_path / "run", tmp_path / "hf", torch.float32)
