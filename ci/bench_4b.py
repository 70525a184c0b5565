"""A 4B-class model through ``relax train`` on 4 GPUs (issue 38, run 6): step time, its phases, MFU, peak memory per
GPU and weight-sync seconds per GB.

    python3 ci/bench_4b.py --json /tmp/out/bench_4b.json                      # GPU machine with 4 GPUs
    python3 ci/bench_4b.py --device cpu --model-script tests/data/tiny_model_args.sh --gpus 1 --tp 1 \\
        --prompts 2 --generations 2 --prompt-len 8 --max-new 8 --steps 2 --warmup 1 --backend torch  # CPU smoke

The model is the one ``--model-script`` describes (default: ``scripts/models/qwen3-4B.sh``, Qwen3-4B's shape: 36
layers, hidden 2560, GQA 32/8, vocab 151936, tied embeddings), built the way a user's launch script builds it: its
``MODEL_ARGS`` are passed to ``relax train`` with ``--hf-checkpoint`` naming a directory that holds only a tokenizer,
so relax materialises seeded random-init weights from the flags (relax/models/arch_flags.py). Nothing is downloaded.
The tokenizer is a word-level one with as many ids as the script's ``--vocab-size``.

Workload: ``--prompts`` 8 prompts x ``--generations`` 8 samples per step, each prompt exactly ``--prompt-len`` 1024
tokens, at most ``--max-new`` 1024 new tokens (a random-init model rarely emits EOS, so responses run ~1k), GRPO with
ci/bench_grpo_e2e.py's reward, Megatron with the distributed optimizer at TP=``--tp`` (+ sequence parallel) x DP =
``--gpus`` / ``--tp``, colocated with one embedded engine per GPU (``--colocate --resource '{"actor": [1, G],
"rollout": [1, G]}'``).

Reported (medians over the steps after ``--warmup``): step seconds and its phases (rollout, train, weight sync,
colocate offload), the train phase's MFU (causal counting, ci/bench_megatron.py's FlopModel: 6N + 6Lhs per token,
8N + 8Lhs when the old log-probs take a forward of their own; over all GPUs at ``--peak-tflops``), the peak memory
of each GPU (``nvidia-smi`` polled every 0.5 s: every process on it, trainer rank and engine together), and the
weight sync's seconds per GB (bytes from ``events.jsonl``). "Fits an H100" is the peak against ``--fit-gib`` 80.

Exit status 0 when the run trained every step, 1 when it failed, 2 when the machine has too few GPUs.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ci.bench_grpo_e2e import REPO, log, log_tail, prompt_texts, run_logged, subprocess_env  # noqa: E402
from ci.bench_megatron import H100_SXM_BF16_TFLOPS, FlopModel, mfu  # noqa: E402
from ci.provenance import write_result  # noqa: E402
from ci.run_figures import MOVES as OFFLOAD_MOVES  # noqa: E402
from ci.run_figures import read_jsonl, sync_figures  # noqa: E402

DEFAULT_SCRIPT = REPO / "scripts" / "models" / "qwen3-4B.sh"


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-script", default=str(DEFAULT_SCRIPT), help="a scripts/models/*.sh defining MODEL_ARGS")
    ap.add_argument("--gpus", type=int, default=4, help="GPUs: trainer ranks and engines (one each per GPU)")
    ap.add_argument("--tp", type=int, default=2, help="--tensor-model-parallel-size (with --sequence-parallel when > 1)")
    ap.add_argument("--backend", default="megatron", choices=["megatron", "torch"], help="--train-backend")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--generations", type=int, default=8, help="samples per prompt")
    ap.add_argument("--prompt-len", type=int, default=1024, help="tokens per prompt (exact)")
    ap.add_argument("--max-new", type=int, default=1024, help="max new tokens per sample")
    ap.add_argument("--micro-batch", type=int, default=4, help="--micro-batch-size (sequences per rank per micro-batch)")
    ap.add_argument("--recompute", action="store_true", help="--recompute-granularity full --recompute-method uniform "
                                                               "--recompute-num-layers 1")
    ap.add_argument("--steps", type=int, default=6, help="--num-rollout")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--peak-tflops", type=float, default=H100_SXM_BF16_TFLOPS,
                    help="per-GPU dense bf16 peak for MFU (989: H100 and H200 SXM)")
    ap.add_argument("--fit-gib", type=float, default=80.0, help="the memory a GPU must fit (80: an H100)")
    ap.add_argument("--timeout", type=float, default=540, help="seconds for the relax train subprocess")
    ap.add_argument("--workdir", default=None, help="keep the tokenizer, prompts, run dir and log here")
    ap.add_argument("--json", default=None, help="write the result as JSON to this path")
    ns = ap.parse_args(argv)
    if ns.gpus < 1 or ns.tp < 1 or ns.gpus % ns.tp:
        ap.error(f"--gpus ({ns.gpus}) must be a multiple of --tp ({ns.tp})")
    if not 0 <= ns.warmup < ns.steps:
        ap.error(f"need 0 <= --warmup ({ns.warmup}) < --steps ({ns.steps})")
    return ns


def model_args(script: str) -> list[str]:
    """The ``MODEL_ARGS`` array of a scripts/models/*.sh, as bash expands it."""
    path = Path(script)
    if not path.is_file():
        raise SystemExit(f"bench_4b: --model-script {script}: no such file")
    out = subprocess.run(["bash", "-c", 'source "$1" && printf "%s\\n" "${MODEL_ARGS[@]}"', "_", str(path)],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0 or not out.stdout.strip():
        raise SystemExit(f"bench_4b: --model-script {script}: sourcing it gave no MODEL_ARGS ({out.stderr.strip()[:200]})")
    return out.stdout.splitlines()


def flag_value(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def write_inputs(ns: argparse.Namespace, workdir: Path, vocab: int) -> tuple[Path, Path]:
    """A tokenizer-only directory (``vocab`` word-level ids) and the prompts file."""
    from relax.models.tokenizer import build_wordlevel_tokenizer

    tok_dir = workdir / "tokenizer"
    tokenizer = build_wordlevel_tokenizer(vocab)
    tokenizer.save_pretrained(tok_dir)
    texts = prompt_texts(tokenizer, ns.prompts * ns.steps, ns.prompt_len, ns.seed)
    prompts = workdir / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return tok_dir, prompts


def relax_cmd(ns: argparse.Namespace, arch: list[str], tok_dir: Path, prompts: Path, out_dir: Path) -> list[str]:
    completions = ns.prompts * ns.generations
    layout = json.dumps({"actor": [1, ns.gpus], "rollout": [1, ns.gpus]})
    argv = [sys.executable, "-m", "relax.cli", "train", "--train-backend", ns.backend, "--colocate", "--resource", layout,
            "--device", ns.device, "--hf-checkpoint", str(tok_dir), *arch,
            "--prompt-data", str(prompts), "--input-key", "prompt", "--custom-rm-path", "ci.bench_grpo_e2e.relax_reward",
            "--rollout-batch-size", str(ns.prompts), "--n-samples-per-prompt", str(ns.generations),
            "--global-batch-size", str(completions), "--micro-batch-size", str(ns.micro_batch),
            "--rollout-max-response-len", str(ns.max_new), "--rollout-max-context-len", str(ns.prompt_len + ns.max_new),
            "--rollout-temperature", "1.0", "--advantage-estimator", "grpo", "--lr", str(ns.lr), "--weight-decay", "0",
            "--clip-grad", "1.0", "--num-rollout", str(ns.steps), "--seed", str(ns.seed), "--rollout-seed", str(ns.seed),
            "--output-dir", str(out_dir)]
    if "--max-position-embeddings" not in arch and "--seq-length" not in arch:  # a launch script's job, not the model's
        argv += ["--seq-length", str(ns.prompt_len + ns.max_new)]
    if ns.backend == "megatron":
        argv += ["--bf16", "--use-distributed-optimizer", "--tensor-model-parallel-size", str(ns.tp)]
        if ns.tp > 1:
            argv.append("--sequence-parallel")
        if ns.recompute:
            argv += ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
    if ns.device == "cuda":
        argv += ["--embedded-runner", "lean"]
    return argv


class GpuMemoryPoller:
    """Peak ``memory.used`` (MiB) per GPU index, from ``nvidia-smi -lms``: every process on the GPU counted."""

    def __init__(self, interval_ms: int = 500) -> None:
        self.peak_mib: dict[int, int] = {}
        self._proc = None
        if shutil.which("nvidia-smi"):
            self._proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                           f"-lms={interval_ms}"], stdout=subprocess.PIPE, text=True)
            self._thread = threading.Thread(target=self._read, daemon=True)
            self._thread.start()

    def _read(self) -> None:
        for line in self._proc.stdout:
            parts = [p.strip() for p in line.split(",")]
            if len(parts) == 2 and parts[0].isdigit() and parts[1].isdigit():
                index, used = int(parts[0]), int(parts[1])
                self.peak_mib[index] = max(self.peak_mib.get(index, 0), used)

    def stop(self) -> dict[int, int]:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait(timeout=10)
            self._thread.join(timeout=10)
        return dict(sorted(self.peak_mib.items()))


def median_of(steps: list[dict], key: str) -> float | None:
    values = [float(m[key]) for m in steps if key in m]
    return statistics.median(values) if values else None


def summarize(ns: argparse.Namespace, steps: list[dict], hf_dir: Path, events: list[dict]) -> dict:
    """The medians over the timed steps, the train phase's MFU and the sync's s/GB (with its phases)."""
    timed = steps[ns.warmup:]
    row = {key.removeprefix("perf/").removesuffix("_s"): median_of(timed, key) for key in
           ("perf/step_time_s", "perf/rollout_time_s", "perf/train_time_s", "perf/sync_time_s")}
    offload = [sum(float(m.get(f"perf/{what}_time_s", 0.0)) for what in OFFLOAD_MOVES) for m in timed]
    row["offload_time"] = statistics.median(offload) if offload else None
    row["response_len_mean"] = median_of(timed, "rollout/response_len_mean")
    row["steps"], row["steps_timed"] = len(steps), len(timed)
    completions = ns.prompts * ns.generations
    row["samples_per_s"] = completions / row["step_time"] if row["step_time"] else None
    train_s, resp = row["train_time"], row["response_len_mean"]
    if train_s and resp is not None and (hf_dir / "config.json").is_file():
        import transformers as tf

        flops = FlopModel.from_hf_config(tf.AutoConfig.from_pretrained(hf_dir))
        seq = ns.prompt_len + resp
        old_forward = not (timed[-1] if timed else {}).get("train/old_log_probs_from_step", 0.0)
        per_token = flops.rl_step_flops_per_token(seq, causal=True, old_forward=old_forward)
        row["params"] = flops.total_params
        row["train_tokens_per_step"] = completions * seq
        row["train_flops_counted"] = "8N+8Lhs (causal) per token" if old_forward else "6N+6Lhs (causal) per token"
        row["train_mfu"] = mfu(per_token, completions * seq, train_s, ns.peak_tflops * ns.gpus)
    sync = sync_figures(events, warmup=ns.warmup) or {}
    row["sync_gb"], row["sync_s_per_gb"] = sync.get("gb_per_sync"), sync.get("s_per_gb")
    row["sync_phases_s_per_gb"], row["sync_transports"] = sync.get("phases_s_per_gb"), sync.get("transports")
    return row


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    if ns.device == "cuda":
        import torch

        if torch.cuda.device_count() < ns.gpus:
            print(f"bench_4b: --gpus {ns.gpus} asks for more GPUs than this machine has ({torch.cuda.device_count()})",
                  file=sys.stderr)
            return 2
    arch = model_args(ns.model_script)
    vocab = int(flag_value(arch, "--vocab-size") or 32000)
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_4b_") as tmp:
        workdir = Path(ns.workdir or tmp).resolve()
        workdir.mkdir(parents=True, exist_ok=True)
        out_dir, log_path = workdir / "run", workdir / "relax_train.log"
        if out_dir.exists():  # relax train resumes into an existing run dir
            shutil.rmtree(out_dir)
        tok_dir, prompts = write_inputs(ns, workdir, vocab)
        log(f"{Path(ns.model_script).name}: TP={ns.tp} x DP={ns.gpus // ns.tp} on {ns.gpus} GPU(s), {ns.prompts} x "
            f"{ns.generations} samples of {ns.prompt_len} + <= {ns.max_new} tokens, {ns.steps} steps (log: {log_path})")
        poller = GpuMemoryPoller()
        ray_dir = tempfile.mkdtemp(prefix="rb", dir="/tmp")  # Ray's socket paths must stay short
        try:
            code, wall = run_logged(relax_cmd(ns, arch, tok_dir, prompts, out_dir), log_path,
                                    subprocess_env(ns, ray_dir), ns.timeout, workdir)
        finally:
            peak = poller.stop()
            shutil.rmtree(ray_dir, ignore_errors=True)
        steps, events = (read_jsonl(p) if p.exists() else [] for p in (out_dir / "metrics.jsonl", out_dir / "events.jsonl"))
        row = summarize(ns, steps, out_dir / "model_from_flags", events)
        failed = code != 0 or len(steps) < ns.steps
        note = f"exit {code}{' (timeout)' if code == 124 else ''}, {len(steps)}/{ns.steps} steps" if failed else ""
        if failed:
            log(f"FAILED: {note}\n{log_tail(log_path, 25)}")
    row["peak_gib_per_gpu"] = {str(i): round(mib / 1024, 2) for i, mib in peak.items()}
    row["fits_gib"] = ns.fit_gib
    row["fits"] = max(peak.values()) / 1024 <= ns.fit_gib if peak else None
    row["status"], row["note"], row["wall_s"] = ("failed" if failed else "ok"), note, wall

    def fmt(v, spec=".3f"):
        return format(v, spec) if isinstance(v, (int, float)) else "-"

    print(f"step {fmt(row['step_time'])} s = rollout {fmt(row['rollout_time'])} + train {fmt(row['train_time'])} + "
          f"sync {fmt(row['sync_time'])} (+ offload {fmt(row['offload_time'])}) s; {fmt(row['samples_per_s'], '.1f')} "
          f"samples/s; mean response {fmt(row['response_len_mean'], '.0f')} tokens")
    print(f"train MFU {fmt(row.get('train_mfu'), '.1%')} ({row.get('train_flops_counted', '-')}, "
          f"{ns.gpus} x {ns.peak_tflops:g} TFLOPS); sync {fmt(row['sync_gb'], '.2f')} GB at "
          f"{fmt(row['sync_s_per_gb'], '.4f')} s/GB")
    print(f"peak GiB per GPU: {row['peak_gib_per_gpu'] or '- (no nvidia-smi)'}; fits {ns.fit_gib:g} GiB: "
          f"{'-' if row['fits'] is None else ('yes' if row['fits'] else 'NO')}")
    if ns.json:
        write_result(ns.json, setup={**vars(ns), "model_args": arch}, rows=[row], failures=[note] if failed else [],
                     wall_s=time.perf_counter() - t0)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
