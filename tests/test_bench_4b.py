"""ci/bench_4b.py (issue 38, run 6) on the CPU: the model script's flags reach relax train, and a smoke run reports
its phases and the model it built."""

from __future__ import annotations

import json
from pathlib import Path

from ci import bench_4b

ROOT = Path(__file__).resolve().parents[1]
TINY = """MODEL_ARGS=(
   --swiglu --num-layers 2 --hidden-size 64 --ffn-hidden-size 128
   --num-attention-heads 4 --group-query-attention --num-query-groups 2
   --use-rotary-position-embeddings --disable-bias-linear --normalization "RMSNorm" --norm-epsilon 1e-6
   --rotary-base 1000000 --vocab-size 512 --kv-channels 16 --qk-layernorm
)
"""


def test_model_args_are_the_qwen3_4b_scripts_shape() -> None:
    args = bench_4b.model_args(str(bench_4b.DEFAULT_SCRIPT))
    for flag, value in (("--num-layers", "36"), ("--hidden-size", "2560"), ("--num-attention-heads", "32"),
                        ("--num-query-groups", "8"), ("--vocab-size", "151936"), ("--normalization", "RMSNorm")):
        assert bench_4b.flag_value(args, flag) == value, flag


def test_relax_flags_are_tp_x_dp_colocate_with_sequence_parallel(tmp_path: Path) -> None:
    ns = bench_4b.parse([])
    cmd = bench_4b.relax_cmd(ns, ["--num-layers", "36"], tmp_path / "tok", tmp_path / "p.jsonl", tmp_path / "run")
    assert json.loads(bench_4b.flag_value(cmd, "--resource")) == {"actor": [1, 4], "rollout": [1, 4]}
    assert bench_4b.flag_value(cmd, "--tensor-model-parallel-size") == "2" and "--sequence-parallel" in cmd
    assert "--colocate" in cmd and "--use-distributed-optimizer" in cmd and "--num-layers" in cmd
    assert bench_4b.flag_value(cmd, "--rollout-max-context-len") == "2048"
    assert bench_4b.flag_value(cmd, "--seq-length") == "2048"  # the model script gives no position limit


def test_cpu_smoke_run_builds_the_model_from_the_script_and_reports_phases(tmp_path: Path, capsys) -> None:
    script = tmp_path / "tiny.sh"
    script.write_text(TINY)
    out = tmp_path / "out.json"
    code = bench_4b.main(["--device", "cpu", "--model-script", str(script), "--gpus", "1", "--tp", "1",
                          "--backend", "torch", "--prompts", "2", "--generations", "2", "--prompt-len", "8",
                          "--max-new", "8", "--steps", "3", "--warmup", "1", "--micro-batch", "2",
                          "--workdir", str(tmp_path / "w"), "--json", str(out)])
    assert code == 0, capsys.readouterr()
    row = json.loads(out.read_text())["rows"][0]
    assert row["status"] == "ok" and row["steps"] == 3 and row["steps_timed"] == 2
    assert row["step_time"] > 0 and row["train_time"] > 0 and row["sync_gb"] > 0 and row["train_mfu"] > 0
    built = json.loads((tmp_path / "w" / "run" / "model_from_flags" / "config.json").read_text())
    assert (built["num_hidden_layers"], built["hidden_size"], built["vocab_size"]) == (2, 64, 512)


def test_too_few_gpus_is_exit_2(capsys) -> None:
    assert bench_4b.main(["--gpus", "64"]) == 2
    assert "more GPUs than this machine has" in capsys.readouterr().err
