"""End-to-end GRPO step time: ``relax train`` vs TRL's ``GRPOTrainer`` on one workload, side by side in one run.

    python3 ci/bench_grpo_e2e.py                          # GPU: TRL, relax (torch backend), relax (megatron) if importable
    python3 ci/bench_grpo_e2e.py --quick                  # 5 steps per system instead of 8
    python3 ci/bench_grpo_e2e.py --json /tmp/out/grpo.json --workdir /tmp/out/grpo_runs
    python3 ci/bench_grpo_e2e.py --device cpu --model tiny-qwen3 --prompt-len 8 --max-new 8 \\
        --prompts 2 --generations 4 --steps 3 --warmup 1 --systems relax-torch   # CPU smoke (numbers mean nothing)

Prints progress to stderr and one table to stdout; exit status 0 when every requested system ran
(a system that cannot run here, TRL not installed or megatron-core not importable, is a skipped row;
targets missed are reported, not failures), 1 when a system failed, 2 when this machine cannot run it.

The workload (MACHINES.md's TRL baseline line), identical on both sides:

* model ``--model`` (bench-270m: random-init Qwen3, 267M params) built by `relax.models.build_model`
  with the same ``--seed`` on both sides, and its own tokenizer (wordlevel-32k, an HF
  ``PreTrainedTokenizerFast``; pad ``<|endoftext|>``, EOS ``<|im_end|>``);
* ``--prompts`` 8 prompts x ``--generations`` 8 completions per optimizer step (64 completions), each
  prompt exactly ``--prompt-len`` 128 tokens of random words from a fixed seed (plain text, no chat
  template), new prompts every step (``--steps`` x 8 prompts, in file order on both sides);
* at most ``--max-new`` 256 completion tokens, temperature 1.0, no top-k/top-p; the random-init
  model rarely samples EOS, so almost every completion is full length on both sides (each row
  reports its mean completion length, and tokens/s counts the tokens generated);
* reward: the fraction of completion tokens with an even id (dense, identical on both sides;
  `even_fraction`); GRPO, beta = 0 (no KL, no reference model), one optimizer step per rollout,
  AdamW lr ``--lr`` 1e-6, weight decay 0, grad clip 1.0, no gradient checkpointing, all 64
  sequences in one micro-batch (``--micro-batch``).

TRL side (TRL 1.16.0, each row in its own subprocess so its CUDA memory is gone before the next starts):
``GRPOTrainer(model, reward_funcs=trl_reward, args=GRPOConfig(per_device_train_batch_size=64,
num_generations=8, max_completion_length=256, bf16=True, gradient_checkpointing=False, beta=0.0,
report_to="none", logging_steps=1, ...), train_dataset, processing_class=tokenizer)`` with the model's
weights in bf16, once per generation path of TRL that needs no other server (``--trl-modes``, `TRL_MODES`):
its default (transformers ``generate``, dynamic KV cache), ``cache_implementation="static"`` (with
the model config's dtype set to the weights' dtype: transformers versions that allocate the static
cache from the config's dtype otherwise allocate float32, which failed under ``bf16=True`` on the H100
with ``index_copy_(): ... Float and ... BFloat16``; transformers 5.24 on CPU runs either way) and
``use_transformers_continuous_batching=True``. A path that fails is a row with its error; the ratio
is taken against the fastest TRL row that ran, and the table says which. A ``TrainerCallback``
times each step from ``on_step_begin`` to ``on_step_end`` (generation, reward, loss, backward,
optimizer; CUDA synchronized at both ends).

Relax side: ``python3 -m relax.cli train --colocate --device cuda --train-backend torch`` (fp32:
the torch backend trains and exports fp32, so its engine runs fp32 too) and, when megatron-core is
importable, ``--train-backend megatron --use-distributed-optimizer`` (bf16), each with
``--embedded-runner lean`` (CUDA graphs on CUDA; ``--engine-compile`` adds ``--embedded-compile``).
Per-step ``perf/step_time_s`` (rollout + reward + train + weight sync), ``perf/rollout_time_s``,
``perf/train_time_s``, ``perf/sync_time_s``, the colocate offload moves (``perf/<what>_time_s`` of
the engines' release/resume and the trainer's offload/onload, part of the step time, the release
and onload inside ``train s``: the ``offload s`` column) and ``rollout/response_len_mean`` come from the run's metrics.jsonl
(docs/artifacts.md).

``relax-megatron-sglang`` (named in ``--systems``, not a default): relax-megatron's workload with
``--rollout-backend sglang``: a real SGLang 0.5.14 server per engine (``RELAX_SGLANG_PYTHONPATH`` names its site
dir), colocated with the Megatron trainer, with `SGLANG_FLAGS` and decode CUDA graphs up to one step's completions
(instead of ``--embedded-runner lean``). After the table, one line per relax row says where its step goes
(``perf/<phase>_time_s``, `PHASES`: generate, SGLang's own time, reward; train columns and update; sync; the
engines' release/resume and the trainer's offload/onload), and one line gives relax-megatron-sglang's step,
rollout, train, sync and offload over relax-megatron's (``sglang_over_embedded`` in the JSON).

``sync s/GB`` is the median sync time over the bytes one sync sends (the ``weights_synced`` events'
``bytes``), as ``relax train`` does it: CUDA IPC on one GPU by default (``--weight-sync-transport``),
checksums of both sides included (target <= 0.05 s/GB).

Every system: median over the steps after the first ``--warmup`` (2) (``--steps`` per TRL row, ``--relax-steps``
per relax row: relax's steps cost ~0.5 s each, so more of them steady its median for seconds); completion tokens/s =
completions per step x mean completion length / median step time. Targets: relax <= 0.5 s per
step, and >= 10x faster than TRL (the fastest TRL row's median step / relax's, measured in this run).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ci.provenance when run as a script
from ci.provenance import write_result  # noqa: E402
from ci.run_figures import MOVES as OFFLOAD_MOVES  # noqa: E402
from ci.run_figures import read_jsonl, sync_figures  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
STEP_TARGET_S = 0.5
SPEEDUP_TARGET = 10.0
TRL_VERSION = "1.16.0"
SYSTEMS = ("trl", "relax-torch", "relax-megatron", "relax-megatron-sglang")
DEFAULT_SYSTEMS = SYSTEMS[:3]
"""Every system but the SGLang row, which needs sglang 0.5.14 (RELAX_SGLANG_PYTHONPATH): name it to run it."""
SGLANG_SYSTEM = "relax-megatron-sglang"
SGLANG_FLAGS = ("--sglang-attention-backend", "triton", "--sglang-grammar-backend", "none", "--sglang-sampling-backend",
                "pytorch", "--sglang-mem-fraction-static", "0.3", "--sglang-disable-prefill-cuda-graph")
"""What real SGLang 0.5.14 needs on the air-gapped H200 (gpu_session.sh's sglang_colocate): triton attention (the
carried sgl_kernel has no FA3), no grammar backend (xgrammar is not carried), torch sampling, 0.3 of the GPU beside
the colocated trainer, no prefill CUDA graphs; decode CUDA graphs stay on, up to one step's completions."""
PHASES = ("rollout_generate", "rollout_engine", "rollout_reward", "train_columns", "train_update",
          "release_rollout", "resume_rollout", "offload_train", "onload_train")
"""Where a relax step's time goes, ``perf/<phase>_time_s`` of metrics.jsonl (docs/artifacts.md; ci/run_figures.py)."""
QUICK = dict(steps=5)
RESULT_PREFIX = "BENCH_GRPO_RESULT "


@dataclass(frozen=True)
class TrlMode:
    """One of TRL's generation paths: the ``GRPOConfig`` fields that select it, and its row's name."""

    name: str
    what: str  # the row's note
    config: dict[str, Any]

    def row(self, version: str) -> str:
        return f"trl-{version}" if self.name == "default" else f"trl-{version} {self.name}"


TRL_MODES = {m.name: m for m in (
    TrlMode("default", "transformers generate, dynamic cache", {}),
    TrlMode("static", "generate, cache_implementation='static'", {"cache_implementation": "static"}),
    TrlMode("continuous-batching", "transformers continuous batching", {"use_transformers_continuous_batching": True}),
)}


# ---------------------------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-270m", help="model preset (relax.models.PRESETS)")
    ap.add_argument("--prompts", type=int, default=8, help="prompts per step")
    ap.add_argument("--generations", type=int, default=8, help="completions per prompt (GRPO group size)")
    ap.add_argument("--prompt-len", type=int, default=128, help="tokens per prompt (exact)")
    ap.add_argument("--max-new", type=int, default=256, help="max completion tokens")
    ap.add_argument("--steps", type=int, default=None, help="optimizer steps per system (default 8; --quick 5)")
    ap.add_argument("--relax-steps", type=int, default=None,
                    help="steps of the relax rows (default --steps): at ~0.5 s a step, more of them cost seconds where "
                         "TRL's cost minutes, and steady the relax median against the odd slow step")
    ap.add_argument("--warmup", type=int, default=2, help="first steps left out of the medians")
    ap.add_argument("--quick", action="store_true", help="fewer steps: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()))
    ap.add_argument("--micro-batch", type=int, default=64, help="relax micro-batch (capped at the step's completions)")
    ap.add_argument("--lr", type=float, default=1e-6)
    ap.add_argument("--seed", type=int, default=1234, help="model init seed (both sides) and data seed")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=SYSTEMS,
                    help=f"rows to run ({SGLANG_SYSTEM}: relax-megatron with --rollout-backend sglang, SGLANG_FLAGS; "
                         "needs sglang, e.g. RELAX_SGLANG_PYTHONPATH=/tmp/sglsite)")
    ap.add_argument("--trl-modes", nargs="+", default=list(TRL_MODES), choices=list(TRL_MODES),
                    help="TRL's generation paths, a row each (the ratio is against the fastest that ran)")
    ap.add_argument("--engine-compile", action="store_true", help="relax: also --embedded-compile")
    ap.add_argument("--timeout", type=float, default=1200, help="seconds per system (subprocess)")
    ap.add_argument("--workdir", default=None, help="keep prompts, run dirs and logs here (default: a temp dir)")
    ap.add_argument("--json", default=None, help="also write the rows and the setup as JSON to this path")
    ap.add_argument("--baseline-tree", default=None,
                    help="a checkout of an earlier commit (e.g. `git archive REF | tar -x -C DIR`): each relax row is "
                         "also run from that tree's code, as `relax-<backend>@<--baseline-label>`, in the same run")
    ap.add_argument("--baseline-label", default="base", help="the name of --baseline-tree's rows (e.g. its commit)")
    ap.add_argument("--trl-worker", default=None, help=argparse.SUPPRESS)  # internal: run the TRL side
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    ns = ap.parse_args(argv)
    if ns.steps is None:
        ns.steps = QUICK["steps"] if ns.quick else 8
    if min(ns.prompts, ns.generations, ns.prompt_len, ns.max_new, ns.steps, ns.micro_batch) < 1:
        ap.error("--prompts, --generations, --prompt-len, --max-new, --steps and --micro-batch must be >= 1")
    if ns.generations < 2:
        ap.error("--generations must be >= 2 (GRPO needs a group)")
    ns.relax_steps = ns.steps if ns.relax_steps is None else ns.relax_steps
    if not 0 <= ns.warmup < min(ns.steps, ns.relax_steps):
        ap.error(f"need 0 <= --warmup ({ns.warmup}) < --steps ({ns.steps}) and --relax-steps ({ns.relax_steps})")
    ns.systems = list(dict.fromkeys(ns.systems))
    ns.trl_modes = list(dict.fromkeys(ns.trl_modes))
    return ns


def log(msg: str) -> None:
    print(f"[bench_grpo_e2e {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------- workload
def even_fraction(token_ids: list[int]) -> float:
    """The reward on both sides: the fraction of completion tokens whose id is even (0 for none)."""
    ids = list(token_ids)
    return sum(1 for t in ids if t % 2 == 0) / len(ids) if ids else 0.0


def relax_reward(args: Any, sample: Any, **kwargs: Any) -> float:
    """``--custom-rm-path ci.bench_grpo_e2e.relax_reward``: `even_fraction` of the response tokens."""
    return even_fraction(sample.tokens[len(sample.tokens) - sample.response_length:])


def trl_reward(prompts: list, completions: list, completion_ids: list[list[int]], **kwargs: Any) -> list[float]:
    """TRL's reward-function contract: `even_fraction` of each completion's token ids."""
    return [even_fraction(ids) for ids in completion_ids]


def prompt_texts(tokenizer: Any, n: int, length: int, seed: int) -> list[str]:
    """``n`` plain-text prompts of exactly ``length`` tokens: random word-like (alphanumeric) tokens."""
    specials = set(tokenizer.all_special_ids)
    words = [(i, tok) for i, tok in enumerate(tokenizer.convert_ids_to_tokens(list(range(len(tokenizer)))))
             if i not in specials and tok.isalnum()]
    rng = random.Random(seed)
    sep = " " if len(tokenizer.encode("a b", add_special_tokens=False)) == 2 else ""  # word-level vs char-level
    texts = []
    for _ in range(n):
        picked = [words[rng.randrange(len(words))] for _ in range(length)]
        text = sep.join(tok for _, tok in picked)
        if tokenizer.encode(text, add_special_tokens=False) != [i for i, _ in picked]:
            raise RuntimeError(f"prompt text does not tokenize back to its {length} tokens: {text[:60]!r}")
        texts.append(text)
    return texts


def write_prompts(ns: argparse.Namespace, workdir: Path) -> Path:
    from relax.models import load_tokenizer

    path = workdir / "prompts.jsonl"
    texts = prompt_texts(load_tokenizer(ns.model), ns.prompts * max(ns.steps, ns.relax_steps), ns.prompt_len, ns.seed)
    path.write_text("".join(json.dumps({"prompt": t}) + "\n" for t in texts))
    return path


# ---------------------------------------------------------------------------------------------- results
@dataclass
class SystemResult:
    system: str
    precision: str
    completions: int
    warmup: int
    step_s: list[float] = field(default_factory=list)  # every step, warm-up included
    rollout_s: list[float] = field(default_factory=list)
    train_s: list[float] = field(default_factory=list)
    sync_s: list[float] = field(default_factory=list)
    offload_s: list[float] = field(default_factory=list)  # relax --colocate: engine release/resume, trainer off/onload
    completion_len: list[float] = field(default_factory=list)
    phases_s: dict[str, list[float]] = field(default_factory=dict)  # relax rows: PHASES, per step
    sync_gb: float | None = None  # weights sent per sync (events.jsonl ``weights_synced`` bytes / 1e9)
    transports: str = ""  # the weight-sync transports the run used
    wall_s: float = 0.0
    status: str = "ok"  # ok | skipped | failed
    note: str = ""

    def _median(self, values: list[float]) -> float | None:
        timed = values[self.warmup:]
        return statistics.median(timed) if timed else None

    @property
    def median_step_s(self) -> float | None:
        return self._median(self.step_s) if self.status == "ok" else None

    @property
    def mean_completion_len(self) -> float | None:
        timed = self.completion_len[self.warmup:]
        return statistics.fmean(timed) if timed else None

    @property
    def tokens_per_s(self) -> float | None:
        step, length = self.median_step_s, self.mean_completion_len
        return self.completions * length / step if step and length is not None else None

    def summary(self, trl: SystemResult | None) -> dict[str, Any]:
        """This row's figures; ``trl``: the TRL row the ratio is taken against (the fastest that ran)."""
        step = self.median_step_s
        relax = self.system.startswith("relax")
        trl_step_s = trl.median_step_s if trl is not None else None
        ratio = trl_step_s / step if relax and step and trl_step_s else None
        return {
            "system": self.system, "precision": self.precision, "status": self.status,
            "median_step_s": step, "rollout_s": self._median(self.rollout_s), "train_s": self._median(self.train_s),
            "sync_s": self._median(self.sync_s), "offload_s": self._median(self.offload_s),
            "sync_s_per_gb": self._median(self.sync_s) / self.sync_gb if self.sync_gb and self.sync_s[self.warmup:]
            else None,
            "completion_tokens_per_s": self.tokens_per_s,
            "mean_completion_len": self.mean_completion_len, "trl_over_this": ratio,
            "trl_reference": trl.system if ratio else None,
            "steps": len(self.step_s), "steps_timed": max(len(self.step_s) - self.warmup, 0), "wall_s": self.wall_s,
            "step_target_met": (step <= STEP_TARGET_S) if relax and step else None,
            "speedup_target_met": (ratio >= SPEEDUP_TARGET) if ratio else None,
            "phases_s": {k: self._median(v) for k, v in self.phases_s.items() if self._median(v) is not None},
            "note": self.note, "per_step_s": self.step_s,
        }


# ---------------------------------------------------------------------------------------------- subprocesses
def trl_env(ns: argparse.Namespace) -> dict[str, str]:
    """TRL's worker sees one GPU: with several, HF's Trainer wraps the model in nn.DataParallel, which
    GRPOTrainer refuses (and the comparison is one GPU against one GPU anyway)."""
    env = subprocess_env(ns)
    if ns.device == "cuda":
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").strip()
        env["CUDA_VISIBLE_DEVICES"] = visible.split(",")[0] if visible else "0"
    return env


def subprocess_env(ns: argparse.Namespace, ray_dir: str | None = None, tree: Path = REPO) -> dict[str, str]:
    """``tree``: whose ``relax`` the subprocess imports (this checkout, or ``--baseline-tree``)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    if ns.device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "1")
    if ray_dir:
        env["RELAX_RAY_TEMP_DIR"] = ray_dir
    return env


def run_logged(cmd: list[str], log_path: Path, env: dict[str, str], timeout: float, cwd: Path) -> tuple[int, float]:
    """Run ``cmd`` with stdout+stderr to ``log_path``; (exit code, seconds). 124 on timeout."""
    t0 = time.perf_counter()
    with open(log_path, "w") as fh:
        try:
            code = subprocess.run(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=cwd).returncode
        except subprocess.TimeoutExpired:
            code = 124
    return code, time.perf_counter() - t0


def log_tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# ---------------------------------------------------------------------------------------------- relax side
def relax_argv(ns: argparse.Namespace, backend: str, prompts: Path, out_dir: Path,
               mode: tuple[str, ...] = ("--colocate",), rollout: str = "embedded") -> list[str]:
    """The ``relax train`` flags of this workload for ``--train-backend backend``; ``mode``: the loop and placement;
    ``rollout``: the ``--rollout-backend`` (embedded: the lean runner; sglang: `SGLANG_FLAGS`)."""
    completions = ns.prompts * ns.generations
    argv = ["--train-backend", backend, *mode, "--device", ns.device, "--hf-checkpoint", ns.model,
            "--prompt-data", str(prompts), "--input-key", "prompt", "--custom-rm-path", "ci.bench_grpo_e2e.relax_reward",
            "--rollout-batch-size", str(ns.prompts), "--n-samples-per-prompt", str(ns.generations),
            "--global-batch-size", str(completions), "--micro-batch-size", str(_divisor_at_most(completions, ns.micro_batch)),
            "--rollout-max-response-len", str(ns.max_new), "--rollout-max-context-len", str(ns.prompt_len + ns.max_new),
            "--rollout-temperature", "1.0", "--advantage-estimator", "grpo", "--lr", str(ns.lr), "--weight-decay", "0",
            "--clip-grad", "1.0", "--num-rollout", str(ns.relax_steps), "--seed", str(ns.seed), "--rollout-seed", str(ns.seed),
            "--output-dir", str(out_dir)]
    if backend == "megatron":
        argv.append("--use-distributed-optimizer")
    if rollout == "sglang":
        return argv + ["--rollout-backend", "sglang", *SGLANG_FLAGS, "--sglang-cuda-graph-max-bs-decode", str(completions)]
    argv += ["--embedded-runner", "lean"]
    if ns.engine_compile:
        argv.append("--embedded-compile")
    return argv


def _divisor_at_most(total: int, cap: int) -> int:
    return max(d for d in range(1, min(total, cap) + 1) if total % d == 0)


def read_sync_events(result: SystemResult, events_path: Path) -> None:
    """Bytes per weight sync and the transports used, from the run's ``weights_synced`` events."""
    if not events_path.exists():
        return
    sync = sync_figures(read_jsonl(events_path), warmup=0)
    if sync:
        result.sync_gb = sync["gb_per_sync"]
        result.transports = "+".join(sync["transports"])


def read_relax_metrics(result: SystemResult, metrics_path: Path) -> None:
    if not metrics_path.exists():
        return
    for line in metrics_path.read_text().splitlines():
        if not line.strip():
            continue
        m = json.loads(line)
        result.step_s.append(float(m["perf/step_time_s"]))
        result.offload_s.append(sum(float(m.get(f"perf/{what}_time_s", 0.0)) for what in OFFLOAD_MOVES))
        for phase in PHASES:
            if f"perf/{phase}_time_s" in m:
                result.phases_s.setdefault(phase, []).append(float(m[f"perf/{phase}_time_s"]))
        for key, values in (("perf/rollout_time_s", result.rollout_s), ("perf/train_time_s", result.train_s),
                            ("perf/sync_time_s", result.sync_s), ("rollout/response_len_mean", result.completion_len)):
            if key in m:
                values.append(float(m[key]))


def run_relax(ns: argparse.Namespace, backend: str, prompts: Path, workdir: Path, name: str | None = None,
              mode: tuple[str, ...] = ("--colocate",), tree: Path = REPO, rollout: str = "embedded") -> SystemResult:
    name = name or f"relax-{backend}"
    result = SystemResult(name, "bf16" if backend == "megatron" else "fp32", ns.prompts * ns.generations, ns.warmup)
    out_dir, log_path = workdir / name, workdir / f"{name}.log"
    if out_dir.exists():  # relax train resumes into an existing run dir: a kept --workdir would mix two runs' steps
        log(f"{name}: removing the previous run's {out_dir}")
        shutil.rmtree(out_dir)
    cmd = [sys.executable, "-m", "relax.cli", "train", *relax_argv(ns, backend, prompts, out_dir, mode, rollout)]
    log(f"{name}: relax train, {ns.relax_steps} steps (log: {log_path})")
    ray_dir = tempfile.mkdtemp(prefix="rg", dir="/tmp")  # Ray's socket paths must stay short
    try:
        code, result.wall_s = run_logged(cmd, log_path, subprocess_env(ns, ray_dir, tree), ns.timeout, workdir)
    finally:
        shutil.rmtree(ray_dir, ignore_errors=True)
    read_relax_metrics(result, out_dir / "metrics.jsonl")
    read_sync_events(result, out_dir / "events.jsonl")
    if code != 0 or len(result.step_s) < ns.relax_steps:
        result.status = "failed"
        result.note = (f"exit {code}{' (timeout)' if code == 124 else ''}, {len(result.step_s)}/{ns.relax_steps} steps; "
                       f"see {log_path}")
        log(f"{name} FAILED: {result.note}\n{log_tail(log_path)}")
    else:
        engine = ("SGLang (triton attention, decode CUDA graphs)" if rollout == "sglang"
                  else f"embedded-runner lean{' + compile' if ns.engine_compile else ''}")
        result.note = (f"{engine}; sync {result.transports or '?'}"
                       f"{f' {result.sync_gb:.2f} GB' if result.sync_gb else ''}; wall {result.wall_s:.0f} s")
        log(f"{name}: done in {result.wall_s:.0f} s")
    return result


# ---------------------------------------------------------------------------------------------- TRL side
def run_trl(ns: argparse.Namespace, prompts: Path, workdir: Path, mode: TrlMode) -> SystemResult:
    """One TRL row: ``mode``'s generation path in its own subprocess."""
    result = SystemResult(mode.row(TRL_VERSION), "bf16" if ns.device == "cuda" else "fp32",
                          ns.prompts * ns.generations, ns.warmup)
    slug = f"trl-{mode.name}"
    config = workdir / f"{slug}_config.json"
    config.write_text(json.dumps({**vars(ns), "prompts_path": str(prompts), "workdir": str(workdir),
                                  "trl_mode": mode.name}))
    log_path = workdir / f"{slug}.log"
    log(f"{result.system} GRPOTrainer ({mode.what}): {ns.steps} steps (log: {log_path})")
    code, result.wall_s = run_logged([sys.executable, str(Path(__file__).resolve()), "--trl-worker", str(config)],
                                     log_path, trl_env(ns), ns.timeout, workdir)
    lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.startswith(RESULT_PREFIX)]
    data = json.loads(lines[-1][len(RESULT_PREFIX):]) if lines else {}
    if data.get("skipped"):
        result.status, result.note = "skipped", data["skipped"]
        print(data["skipped"], file=sys.stderr)
        return result
    result.step_s, result.completion_len = data.get("step_s", []), data.get("completion_len", [])
    version = data.get("version", TRL_VERSION)
    result.system = mode.row(version)
    if code != 0 or len(result.step_s) < ns.steps:
        result.status = "failed"
        error = last_error_line(log_path)
        result.note = (f"exit {code}{' (timeout)' if code == 124 else ''}, {len(result.step_s)}/{ns.steps} steps"
                       f"{f': {error}' if error else ''}; see {log_path}")
        log(f"{result.system} FAILED: {result.note}\n{log_tail(log_path)}")
    else:
        result.note = (f"{mode.what}, {'bf16=True' if ns.device == 'cuda' else 'fp32 (CPU)'}; "
                       f"wall {result.wall_s:.0f} s" + ("" if version == TRL_VERSION else f"; NOT TRL {TRL_VERSION}"))
        log(f"{result.system}: done in {result.wall_s:.0f} s")
    return result


def last_error_line(path: Path) -> str:
    """The last ``SomethingError: message`` line of a log (a traceback's verdict), cut to 200 characters."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    verdicts = [line.strip() for line in lines if re.match(r"^\s*[A-Za-z_.]*(Error|Exception)\b.*:", line)]
    return verdicts[-1][:200] if verdicts else ""


def fastest_trl(results: list[SystemResult]) -> SystemResult | None:
    """The TRL row every ratio is taken against: the fastest median step among the TRL rows that ran."""
    ran = [r for r in results if r.system.startswith("trl") and r.median_step_s is not None]
    return min(ran, key=lambda r: r.median_step_s) if ran else None


def trl_worker(config_path: str) -> int:
    """The TRL side, in its own process: prints ``RESULT_PREFIX {json}`` (per-step seconds and lengths)."""
    cfg = argparse.Namespace(**json.loads(Path(config_path).read_text()))
    try:
        import datasets
        import trl
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        print(RESULT_PREFIX + json.dumps({"skipped": f"trl not installed: TRL row skipped ({exc})"}), flush=True)
        return 0
    import torch
    from transformers import TrainerCallback

    from relax.models import build_model, load_tokenizer

    cuda = cfg.device == "cuda"
    mode = TRL_MODES[getattr(cfg, "trl_mode", "default")]
    if not cuda:
        torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model = build_model(cfg.model, dtype=torch.bfloat16 if cuda else torch.float32, seed=cfg.seed)
    if mode.config.get("cache_implementation") == "static":
        model.config.dtype = next(model.parameters()).dtype  # what the static cache is allocated in (TRL_MODES)
    tokenizer = load_tokenizer(cfg.model)
    records = [json.loads(line) for line in Path(cfg.prompts_path).read_text().splitlines() if line.strip()]
    dataset = datasets.Dataset.from_list([{"prompt": r["prompt"]} for r in records])

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.seconds: list[float] = []
            self._t0 = 0.0

        def on_step_begin(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self._t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.seconds.append(time.perf_counter() - self._t0)
            print(f"[trl] step {len(self.seconds)}: {self.seconds[-1]:.2f} s", file=sys.stderr, flush=True)

    args = GRPOConfig(
        output_dir=str(Path(cfg.workdir) / "trl"), per_device_train_batch_size=cfg.prompts * cfg.generations,
        num_generations=cfg.generations, max_completion_length=cfg.max_new, temperature=1.0, beta=0.0,
        bf16=cuda, gradient_checkpointing=False, learning_rate=cfg.lr, weight_decay=0.0, max_grad_norm=1.0,
        optim="adamw_torch", lr_scheduler_type="constant", max_steps=cfg.steps, logging_steps=1, report_to="none",
        save_strategy="no", seed=cfg.seed, shuffle_dataset=False, use_cpu=not cuda, disable_tqdm=True,
        dataloader_num_workers=0, **mode.config, **trl_mode_sizing(mode, cfg),
    )
    timer = StepTimer()
    trainer = GRPOTrainer(model=model, reward_funcs=trl_reward, args=args, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    lengths = [float(e["completions/mean_length"]) for e in trainer.state.log_history if "completions/mean_length" in e]
    print(RESULT_PREFIX + json.dumps({"step_s": timer.seconds, "completion_len": lengths, "version": trl.__version__}),
          flush=True)
    return 0


def trl_mode_sizing(mode: TrlMode, cfg: argparse.Namespace) -> dict[str, Any]:
    """Continuous batching sizes its paged cache from free memory; on CPU that is the machine's RAM, so
    the CPU smoke gives it the workload's own size (one step's sequences, 256-token pages). On CUDA,
    TRL's own sizing (half the free GPU memory) stands."""
    if not mode.config.get("use_transformers_continuous_batching") or cfg.device == "cuda":
        return {}
    completions = cfg.prompts * cfg.generations
    pages = -(-(cfg.prompt_len + cfg.max_new) // 256)
    return {"transformers_continuous_batching_config": {"num_blocks": completions * pages, "page_size": 256,
                                                        "max_batch_tokens": completions * (cfg.prompt_len + 1)}}


# ---------------------------------------------------------------------------------------------- table
def _num(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _met(flag: bool | None) -> str:
    return {True: "met", False: "MISSED", None: "-"}[flag]


COLUMNS = [("system", "system", "s"), ("precision", "precision", "s"), ("step s (median)", "median_step_s", ".3f"),
           ("rollout s", "rollout_s", ".3f"), ("train s", "train_s", ".3f"), ("sync s", "sync_s", ".3f"),
           ("sync s/GB", "sync_s_per_gb", ".3f"), ("offload s", "offload_s", ".3f"),
           ("completion tok/s", "completion_tokens_per_s", ",.0f"), ("mean completion len", "mean_completion_len", ".1f"),
           ("TRL / this", "trl_over_this", ".2f"), (f"step <= {STEP_TARGET_S:g} s", "step_target_met", "met"),
           (f">= {SPEEDUP_TARGET:g}x TRL", "speedup_target_met", "met"), ("note", "note", "s")]
RIGHT = {2, 3, 4, 5, 6, 7, 8, 9, 10}


def _cell(row: dict[str, Any], key: str, spec: str) -> str:
    value = row[key]
    if spec == "met":
        return _met(value)
    if spec == "s":
        return str(value)
    if key == "trl_over_this" and value is not None:
        return f"{value:.2f}x"
    if row["status"] != "ok" and key == "median_step_s":
        return row["status"].upper() if row["status"] == "failed" else "skipped"
    return _num(value, spec)


def format_table(header: list[str], rows: list[dict[str, Any]]) -> str:
    cells = [[_cell(r, key, spec) for _, key, spec in COLUMNS] for r in rows]
    widths = [max(len(title), *(len(c[i]) for c in cells)) if cells else len(title)
              for i, (title, _, _) in enumerate(COLUMNS)]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.rjust(w) if i in RIGHT else v.ljust(w)
                                 for i, (v, w) in enumerate(zip(values, widths, strict=True))) + " |"

    rule = "|" + "|".join(("-" * (w + 1) + ":") if i in RIGHT else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([*header, "", line([t for t, _, _ in COLUMNS]), rule, *(line(c) for c in cells)])


def header_lines(ns: argparse.Namespace) -> list[str]:
    import torch

    dev = torch.cuda.get_device_name() if ns.device == "cuda" and torch.cuda.is_available() else ns.device
    return [
        f"bench_grpo_e2e: {ns.model}, {ns.prompts} prompts x {ns.generations} completions per step, prompt "
        f"{ns.prompt_len} tokens, <= {ns.max_new} new tokens, temperature 1, GRPO beta=0, AdamW lr {ns.lr:g}, "
        f"one optimizer step per rollout",
        f"{ns.steps} steps per TRL row and {ns.relax_steps} per relax row, medians over all but the first {ns.warmup}; "
        f"{dev}; torch {torch.__version__}",
    ]


def reference_line(results: list[SystemResult], trl: SystemResult | None) -> str:
    ran = [r for r in results if r.system.startswith("trl")]
    if trl is None:
        return "TRL / this: no TRL row ran" if ran else "TRL / this: TRL not run"
    return (f"TRL / this: against {trl.system} ({trl.median_step_s:.3f} s per step), the fastest of the "
            f"{len(ran)} TRL row(s); a failed TRL row shows its error")


def phase_line(row: dict[str, Any]) -> str:
    """Where one relax row's median step goes (medians over the timed steps, each phase on its own)."""
    p = row["phases_s"]

    def fmt(keys: tuple[str, ...]) -> str:
        return ", ".join(f"{k.split('_', 1)[1] if k.startswith(('rollout_', 'train_')) else k} {p[k]:.3f}"
                         for k in keys if k in p)

    parts = [f"rollout {_num(row['rollout_s'], '.3f')} ({fmt(PHASES[:3])})",
             f"train {_num(row['train_s'], '.3f')} ({fmt(PHASES[3:5])})", f"sync {_num(row['sync_s'], '.3f')}",
             f"offload/onload {_num(row['offload_s'], '.3f')} ({fmt(PHASES[5:])})"]
    return f"{row['system']}: step {_num(row['median_step_s'], '.3f')} s: " + "; ".join(parts)


def sglang_vs_embedded(rows: list[dict[str, Any]]) -> dict[str, float] | None:
    """relax-megatron-sglang's median step (and rollout) over relax-megatron's, both from this run."""
    by = {r["system"]: r for r in rows if r["status"] == "ok"}
    emb, sgl = by.get("relax-megatron"), by.get(SGLANG_SYSTEM)
    if not emb or not sgl:
        return None
    out = {"step": sgl["median_step_s"] / emb["median_step_s"]}
    for key in ("rollout_s", "train_s", "sync_s", "offload_s"):
        if sgl[key] and emb[key]:
            out[key.removesuffix("_s")] = sgl[key] / emb[key]
    return out


def sglang_line(ratios: dict[str, float]) -> str:
    rest = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items() if k != "step")
    return f"{SGLANG_SYSTEM} / relax-megatron (embedded): step {ratios['step']:.2f}x ({rest})"


# ---------------------------------------------------------------------------------------------- main
def preflight(ns: argparse.Namespace) -> str | None:
    """Why this machine cannot run the benchmark (None: it can)."""
    import torch

    from relax.models import PRESETS

    if ns.model not in PRESETS:
        return f"--model {ns.model!r}: choose one of {', '.join(PRESETS)}"
    if ns.device == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu runs the smoke path"
    return None


def cannot_run(ns: argparse.Namespace, backend: str, rollout: str) -> str | None:
    """Why a relax row cannot run on this machine (None: it can)."""
    from relax.backends.megatron.checks import module_available

    if backend == "megatron" and ns.device != "cuda":
        return "needs --device cuda"
    if backend == "megatron" and not module_available("megatron.core"):
        return "megatron-core not importable"
    if rollout == "sglang":
        from relax.backends.sglang.launcher import SGLANG_PYTHONPATH, sglang_available

        if not sglang_available():
            return f"sglang not importable (install sglang 0.5.14 or set {SGLANG_PYTHONPATH})"
    return None


def run_systems(ns: argparse.Namespace, workdir: Path) -> list[SystemResult]:
    prompts = write_prompts(ns, workdir)
    results = []
    for system in ns.systems:
        backend, rollout = ("megatron", "sglang") if system == SGLANG_SYSTEM else (system.removeprefix("relax-"),
                                                                                   "embedded")
        why = None if system == "trl" else cannot_run(ns, backend, rollout)
        if system == "trl":
            results.extend(run_trl(ns, prompts, workdir, TRL_MODES[name]) for name in ns.trl_modes)
        elif why:
            results.append(SystemResult(system, "bf16", ns.prompts * ns.generations, ns.warmup, status="skipped",
                                        note=f"{why}: row skipped"))
            log(f"{system}: {why}: row skipped")
        else:
            results.append(run_relax(ns, backend, prompts, workdir, name=system, rollout=rollout))
            if ns.baseline_tree:  # the same workload on the earlier commit's code, right after
                results.append(run_relax(ns, backend, prompts, workdir, name=f"{system}@{ns.baseline_label}",
                                         tree=Path(ns.baseline_tree).resolve(), rollout=rollout))
    return results


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    if ns.trl_worker:
        return trl_worker(ns.trl_worker)
    reason = preflight(ns)
    if reason:
        print(f"bench_grpo_e2e: {reason}", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    if ns.workdir:
        Path(ns.workdir).mkdir(parents=True, exist_ok=True)
        results = run_systems(ns, Path(ns.workdir).resolve())
    else:
        with tempfile.TemporaryDirectory(prefix="bench_grpo_e2e_") as tmp:
            results = run_systems(ns, Path(tmp))
    trl = fastest_trl(results)
    rows = [r.summary(trl) for r in results]
    print(format_table(header_lines(ns) + [reference_line(results, trl)], rows))
    for row in rows:
        if row["status"] == "ok" and row["system"].startswith("relax"):
            print(phase_line(row))
    versus = sglang_vs_embedded(rows)
    if versus:
        print(sglang_line(versus))
    failures = [f"{r['system']}: {r['note']}" for r in rows if r["status"] == "failed" and r["system"].startswith("relax")]
    trl_rows = [r for r in rows if r["system"].startswith("trl")]
    if trl_rows and trl is None and not all(r["status"] == "skipped" for r in trl_rows):
        failures.append("trl: no TRL row ran: " + "; ".join(f"{r['system']}: {r['note']}" for r in trl_rows))
    for f in failures:
        print(f"FAILED: {f}")
    if ns.json:
        write_result(ns.json, setup={k: v for k, v in vars(ns).items() if k != "trl_worker"}, rows=rows,
                     failures=failures, trl_reference=trl.system if trl else None, sglang_over_embedded=versus,
                     targets={"step_s": STEP_TARGET_S, "speedup_vs_trl": SPEEDUP_TARGET},
                     wall_s=time.perf_counter() - t_start)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
