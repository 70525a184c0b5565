"""Megatron backend on one GPU: train MFU and colocate weight-sync seconds per GB (issue 7).

    python3 ci/bench_megatron.py                  # bench-1b, seq 2048, 16 x 2048 tokens per step (~2-3 min on an H100)
    python3 ci/bench_megatron.py --quick          # bench-270m, seq 1024, 8 sequences per step (~1 min)
    python3 ci/bench_megatron.py --model qwen3-0.5b --json /tmp/out/bench_megatron.json

GPU only (megatron-core importable, e.g. ``PYTHONPATH=/tmp/site:$PWD`` after ci/wheelhouse/install.sh).
Prints progress to stderr and one table to stdout; exit status 0 when every measurement ran
and both weight-sync checksum checks passed (targets missed are reported, not failures).

What runs. Nothing is re-implemented: the script builds the same `MegatronTrainBackend` that
``relax train --train-backend megatron --use-distributed-optimizer`` builds (through
`relax.backends.train_registry.build_train_backend` and `relax.utils.arguments.parse_args`,
no Ray), from a random-init model preset (``bench-1b``: Qwen3, hidden 2048, 18 layers, 16 heads
/ 8 KV heads, head_dim 128, intermediate 6144, vocab 32000, untied, 1.04B params), bf16 weights
and activations, fp32 grads, main params and Adam state. The batch is ``--global-batch``
random-token sequences of exactly ``--seq-len`` tokens (no padding; the last
``seq-len - prompt-len`` are the response, rewards alternate 0/1 within each group of 8).
Three training rows are timed, each after ``--warmup`` untimed steps, over ``--steps`` steps:

* ``RL step``: `backend.train_rollout(samples, step)`, exactly what the trainer actor runs per
  rollout: a no-grad forward for the old log-probs (none when the batch is one optimizer step: the
  step's own forward gives them, `train/old_log_probs_from_step`), GRPO advantages, then one optimizer step
  (micro-batched forward + response log-probs/entropy in fp32 + policy loss + backward, then
  Megatron's grad sync, clip and Adam).
* ``policy update``: only that optimizer step (`backend._optimizer_step`), the classic
  fwd+bwd+optimizer measurement, on the same micro-batches and loss.
* ``LM loss``: the same DDP model and optimizer with Megatron's own cross-entropy
  (``GPTModel(..., labels=...)``) instead of the RL loss: isolates the model from the RL
  log-prob path (fp32 ``[b, s, V]`` logits, log-softmax, entropy).

FLOPs (model FLOPs, PaLM appendix B convention; recomputation, padding and the softmax/norm
element-wise work are not counted)::

    forward FLOPs per token  F = 2 * N + 4 * L * h * s
    fwd + bwd                  = 3 * F = 6 * N + 12 * L * h * s        (policy update, LM loss)
    RL step (+1 no-grad fwd)   = 4 * F = 8 * N + 16 * L * h * s   (3 * F without it)
    MFU = FLOPs per token * tokens per step / (seconds per step * peak)
    causal: the attention term halved (4 L h s -> 2 L h s forward): the work a causal mask leaves

with N the parameters that take part in matmuls (every parameter except the input embedding
table when embeddings are untied; a tied table counts once, as the LM head), L layers,
h = num_attention_heads * head_dim (the attention width), s the sequence length, and peak
``--peak-tflops`` (989 = H100 SXM dense bf16). Each MFU is printed twice: counting the full s x s
attention scores (as PaLM and Megatron's MFU do; the target row) and with them halved for the causal
mask (the FLOPs a flash kernel that skips masked blocks does; the lower, honest one). With ``--train-backend megatron`` and no
Transformer Engine installed, Megatron's local layer spec runs its core attention through torch
SDPA (flash kernels; relax/backends/megatron/attention.py), what ``relax train`` builds;
``--attention unfused`` swaps in megatron's own `DotProductAttention` (materialized ``s x s``
scores) for comparison: run the script once per value (``--skip sync`` for the MFU rows only).

Weight sync (colocate, one GPU): an `EmbeddedEngine` over an HF model of the same preset (other
seed, the backend's export dtype) on the same GPU; the GB are the bytes of the HF-named tensors
sent (1 GB = 1e9 bytes). Timed end to end, ``--sync-repeats`` times after one warm-up each:

* ``direct``: `backend.hf_state()` (Megatron -> HF names on the GPU, qkv/fc1 splits copied) then
  `engine.update_weights_from_tensors(...)`: the in-process lower bound of a CUDA-IPC/direct
  tensor sync.
* ``via CPU buckets``: `backend.weight_buckets(--bucket-mb)` (HF tensors copied to CPU, as
  ``relax train``'s colocate sync does today) then one `update_weights_from_tensors` per bucket;
  Ray's object-store transport between the trainer and engine actors is not included.

Before each path the engine's weights are zeroed, so every tensor differs; after it the
engine's checksums (`relax.weights.checksum`) must equal the trainer's, tensor for tensor. The
time of one side's checksums is reported too (``relax train`` computes both on every sync).

``--train-backend torch --device cpu --model tiny-qwen3`` runs the same code path on CPU with the
torch backend (tests/test_bench_megatron.py uses it as a smoke test); its numbers mean nothing.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ci.* when run as a script

H100_SXM_BF16_TFLOPS = 989.0
MFU_TARGET = 0.40
SYNC_TARGET_S_PER_GB = 0.05
GROUP = 8  # samples per prompt in the synthetic GRPO batch

# per model: (seq_len, global_batch, micro_batch) sized for one 80 GB GPU with the local layer spec (bench-1b at
# micro-batch 8: 46 GiB peak on an H100 with the default fusions; micro-batch 4 measured 3-4 MFU points lower)
MODEL_DEFAULTS: dict[str, tuple[int, int, int]] = {
    "bench-1b": (2048, 16, 8),
    "qwen3-0.5b": (2048, 16, 4),
    "bench-270m": (2048, 16, 8),
    "small-qwen3": (512, 16, 8),
    "tiny-qwen3": (64, 8, 4),
}
QUICK = dict(model="bench-270m", seq_len=1024, global_batch=8, micro_batch=4, warmup=1, steps=2, sync_repeats=2)


# ---------------------------------------------------------------------------------------------- arguments
def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help=f"model preset (default bench-1b; {', '.join(MODEL_DEFAULTS)})")
    ap.add_argument("--quick", action="store_true",
                    help="smaller run: " + ", ".join(f"{k}={v}" for k, v in QUICK.items()) + " (explicit flags win)")
    ap.add_argument("--seq-len", type=int, default=None, help="tokens per sequence (default per model)")
    ap.add_argument("--prompt-len", type=int, default=None, help="prompt tokens per sequence (default seq-len / 4)")
    ap.add_argument("--global-batch", type=int, default=None, help="sequences per optimizer step (multiple of 8)")
    ap.add_argument("--micro-batch", type=int, default=None,
                    help="sequences per micro-batch (halved automatically on CUDA out-of-memory)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps before each timed row (default 2)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps per row (default 3)")
    ap.add_argument("--sync-repeats", type=int, default=None, help="timed syncs per path (default 3)")
    ap.add_argument("--bucket-mb", type=int, default=512, help="bucket size of the via-CPU sync (relax default 512)")
    ap.add_argument("--peak-tflops", type=float, default=H100_SXM_BF16_TFLOPS,
                    help="device peak for MFU (989 = H100 SXM dense bf16)")
    ap.add_argument("--no-distributed-optimizer", action="store_true", help="plain Megatron optimizer instead")
    ap.add_argument("--attention", default="sdpa", choices=["sdpa", "unfused"],
                    help="Megatron local spec's core attention: torch SDPA (relax's default) or megatron's unfused "
                         "DotProductAttention (no effect with Transformer Engine or --train-backend torch)")
    ap.add_argument("--unfused", action="store_true",
                    help="pass --no-bias-swiglu-fusion --no-bias-dropout-fusion --no-rope-fusion (megatron-core's unfused "
                         "SwiGLU, residual add and RoPE) to compare with relax's default")
    ap.add_argument("--skip", nargs="*", default=[], choices=["rl", "policy", "lm", "sync"], help="rows to skip")
    ap.add_argument("--json", default=None, help="also write the rows and the setup as JSON to this path")
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the rows, profile one RL step (torch.profiler) and print its N costliest GPU kernels "
                         "to stderr: where the step's time goes; on CUDA also the N host operators the GPU waited "
                         "on longest (ci/host_stalls.py, also in the JSON as host_stalls)")
    ap.add_argument("--trace", default=None, metavar="PATH",
                    help="with --profile: also write the profiled step's chrome trace (torch.profiler) to PATH")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--train-backend", default="megatron", choices=["megatron", "torch"],
                    help="torch: the same code path with the torch backend (CPU smoke test)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and fill the per-model / --quick defaults; raises SystemExit (argparse) on bad values."""
    ap = build_parser()
    ns = ap.parse_args(argv)
    quick = QUICK if ns.quick else {}
    if ns.model is None:
        ns.model = quick.get("model", "bench-1b")
    if ns.model not in MODEL_DEFAULTS:
        ap.error(f"--model {ns.model!r}: choose one of {', '.join(MODEL_DEFAULTS)}")
    seq, gb, mb = MODEL_DEFAULTS[ns.model]
    same_model = ns.model == quick.get("model")
    defaults = dict(seq_len=quick["seq_len"] if same_model else seq,
                    global_batch=quick["global_batch"] if same_model else gb,
                    micro_batch=quick["micro_batch"] if same_model else mb,
                    warmup=quick.get("warmup", 2), steps=quick.get("steps", 3),
                    sync_repeats=quick.get("sync_repeats", 3))
    for key, value in defaults.items():
        if getattr(ns, key) is None:
            setattr(ns, key, value)
    if ns.prompt_len is None:
        ns.prompt_len = ns.seq_len // 4
    if ns.seq_len < 2 or not 1 <= ns.prompt_len < ns.seq_len:
        ap.error(f"need 1 <= --prompt-len ({ns.prompt_len}) < --seq-len ({ns.seq_len})")
    if ns.global_batch < GROUP or ns.global_batch % GROUP:
        ap.error(f"--global-batch {ns.global_batch} must be a positive multiple of {GROUP} (the GRPO group size)")
    if not 1 <= ns.micro_batch <= ns.global_batch:
        ap.error(f"--micro-batch {ns.micro_batch} must be in [1, --global-batch {ns.global_batch}]")
    if ns.profile < 0:
        ap.error("--profile N needs N >= 0")
    if ns.steps < 1 or ns.warmup < 0 or ns.sync_repeats < 1:
        ap.error("--steps and --sync-repeats must be >= 1, --warmup >= 0")
    if ns.bucket_mb < 1 or ns.peak_tflops <= 0:
        ap.error("--bucket-mb and --peak-tflops must be positive")
    if ns.train_backend == "torch" and not ns.no_distributed_optimizer:
        ns.no_distributed_optimizer = True  # a Megatron-only flag
    return ns


def backend_argv(ns: argparse.Namespace, output_dir: str) -> list[str]:
    """The ``relax train`` flags whose backend this script drives (one optimizer step per rollout)."""
    argv = ["--train-backend", ns.train_backend, "--device", ns.device, "--hf-checkpoint", ns.model,
            "--prompt-data", "unused.jsonl", "--rollout-batch-size", str(ns.global_batch // GROUP),
            "--n-samples-per-prompt", str(GROUP), "--global-batch-size", str(ns.global_batch),
            "--micro-batch-size", str(ns.micro_batch), "--num-rollout", "1",
            "--rollout-max-response-len", str(ns.seq_len - ns.prompt_len), "--seed", str(ns.seed),
            "--lr", "1e-6", "--output-dir", output_dir]
    if not ns.no_distributed_optimizer:
        argv.append("--use-distributed-optimizer")
    if ns.unfused and ns.train_backend == "megatron":
        argv += ["--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion"]
    return argv


def preflight(ns: argparse.Namespace) -> str | None:
    """Why this machine cannot run the benchmark (None: it can)."""
    from relax.backends.megatron.checks import module_available

    if ns.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA GPU (torch.cuda.is_available() is False); --device cpu only with --train-backend torch"
    elif ns.train_backend == "megatron":
        return "--train-backend megatron needs --device cuda: megatron-core does not run on CPU"
    if ns.train_backend == "megatron" and not module_available("megatron.core"):
        return ("megatron-core is not importable: install the wheelhouse (bash ci/wheelhouse/install.sh SITE ...) "
                "and export PYTHONPATH=SITE:$PWD")
    return None


# ---------------------------------------------------------------------------------------------- FLOPs
@dataclass(frozen=True)
class FlopModel:
    """The quantities of the MFU formula (module docstring), read from an HF config."""

    layers: int
    attn_width: int  # num_attention_heads * head_dim
    matmul_params: int  # N
    total_params: int

    @classmethod
    def from_hf_config(cls, cfg: Any) -> FlopModel:
        if getattr(cfg, "num_experts", None) or getattr(cfg, "num_local_experts", None):
            raise ValueError(f"FlopModel counts dense decoders; {cfg.model_type} routes each token through some "
                             "of its experts (its active parameters are not its parameters)")
        hidden, layers, vocab = cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size
        heads = cfg.num_attention_heads
        kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
        head_dim = getattr(cfg, "head_dim", None) or hidden // heads
        inter = cfg.intermediate_size
        qwen3 = getattr(cfg, "model_type", "") == "qwen3"
        qkv_bias = getattr(cfg, "model_type", "") == "qwen2" or (not qwen3 and getattr(cfg, "attention_bias", False))
        attn = hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim + heads * head_dim * hidden
        if qkv_bias:
            attn += (heads + 2 * kv_heads) * head_dim
        norms = 2 * hidden + (2 * head_dim if qwen3 else 0)
        per_layer = attn + 3 * hidden * inter + norms
        embed = vocab * hidden
        tied = bool(getattr(cfg, "tie_word_embeddings", False))
        body = layers * per_layer + hidden  # + final norm
        total = body + embed + (0 if tied else embed)
        return cls(layers=layers, attn_width=heads * head_dim, matmul_params=body + embed, total_params=total)

    def forward_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """2 N + 4 L h s; ``causal``: 2 N + 2 L h s (half of the s x s scores are masked)."""
        return 2.0 * self.matmul_params + (2.0 if causal else 4.0) * self.layers * self.attn_width * seq_len

    def train_flops_per_token(self, seq_len: int, causal: bool = False) -> float:
        """fwd + bwd: 6 N + 12 L h s (causal: 6 N + 6 L h s)."""
        return 3.0 * self.forward_flops_per_token(seq_len, causal)

    def rl_step_flops_per_token(self, seq_len: int, causal: bool = False, old_forward: bool = True) -> float:
        """train_rollout: the old-log-prob forward plus fwd + bwd: 8 N + 16 L h s (causal: 8 N + 8 L h s); without
        that forward (``old_forward`` False: the step's own forward gave the old log-probs) as fwd + bwd."""
        return (4.0 if old_forward else 3.0) * self.forward_flops_per_token(seq_len, causal)


def mfu(flops_per_token: float, tokens: int, seconds: float, peak_tflops: float) -> float:
    return flops_per_token * tokens / (seconds * peak_tflops * 1e12)


# ---------------------------------------------------------------------------------------------- table
@dataclass
class Row:
    name: str
    value: float | None  # None: failed or skipped (see note)
    unit: str
    target: str = ""
    ok: bool | None = None  # None: no target
    note: str = ""

    def value_text(self) -> str:
        if self.value is None:
            return "-"
        if self.unit == "%":
            return f"{100 * self.value:.1f}%"
        if self.unit == "tensors" or abs(self.value) >= 100:
            return f"{self.value:,.0f}"
        if abs(self.value) >= 1:
            return f"{self.value:.2f}"
        return f"{self.value:.4f}"

    def status(self) -> str:
        return {True: "met", False: "MISSED", None: ""}[self.ok]


def format_table(header: list[str], rows: list[Row]) -> str:
    cols = [("measurement", [r.name for r in rows]), ("value", [r.value_text() for r in rows]),
            ("unit", [r.unit if r.value is not None else "" for r in rows]), ("target", [r.target for r in rows]),
            ("status", [r.status() for r in rows]), ("note", [r.note for r in rows])]
    widths = [max(len(title), *(len(v) for v in values)) if values else len(title) for title, values in cols]
    right = {1}  # values right-aligned

    def line(cells: list[str]) -> str:
        parts = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))]
        return "| " + " | ".join(parts) + " |"

    out = [*header, "", line([title for title, _ in cols]),
           "|" + "|".join(("-" * (w + 1) + ":") if i in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"]
    out += [line([values[i] for _, values in cols]) for i in range(len(rows))]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- helpers
def log(msg: str) -> None:
    print(f"[bench_megatron {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def device_sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> float:
    device_sync(device)
    t0 = time.perf_counter()
    fn()
    device_sync(device)
    return time.perf_counter() - t0


def time_steps(step: Callable[[int], Any], warmup: int, steps: int, device: str) -> list[float]:
    """Run ``warmup`` untimed then ``steps`` timed calls of ``step(i)``; seconds of the timed ones."""
    for i in range(warmup):
        step(i)
    return [timed(lambda i=i: step(warmup + i), device) for i in range(steps)]


def make_samples(n: int, seq_len: int, prompt_len: int, vocab: int, seed: int) -> list:
    """``n`` random-token samples of exactly ``seq_len`` tokens; rewards alternate so GRPO groups have spread."""
    import torch

    from relax.backends.torch.batch import TrainSample

    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(3, vocab, (n, seq_len), generator=g)
    resp = seq_len - prompt_len
    return [TrainSample(tokens=tokens[i].tolist(), response_length=resp, loss_mask=[1] * resp, reward=float(i % 2))
            for i in range(n)]


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.cuda.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _free_memory(device: str) -> None:
    import gc

    import torch

    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- train rows
@dataclass
class TrainResult:
    rows: list[Row] = field(default_factory=list)
    micro_batch: int = 0
    failures: list[str] = field(default_factory=list)


def lm_loss_step(backend: Any, ids: Any, micro_batch: int, megatron: bool) -> float:
    """One optimizer step on plain next-token cross-entropy through the backend's own model and optimizer."""
    import torch

    backend._zero_grad()
    total = 0.0
    for start in range(0, ids.shape[0], micro_batch):
        mb = ids[start : start + micro_batch]
        if megatron:
            pos = torch.arange(mb.shape[1], device=mb.device).unsqueeze(0).expand_as(mb)
            per_token = backend.model(input_ids=mb, position_ids=pos, attention_mask=None, labels=mb)
            loss = per_token.float().mean() * mb.shape[0] / ids.shape[0]
        else:
            loss = backend.model(input_ids=mb, labels=mb).loss * mb.shape[0] / ids.shape[0]
        loss.backward()
        total += float(loss.detach())
    backend._apply_gradients(total)
    return total


def _vocab(backend: Any) -> int:
    return backend.hf_config.vocab_size if hasattr(backend, "hf_config") else backend.model.config.vocab_size


def run_train_rows(backend: Any, ns: argparse.Namespace, flops: FlopModel) -> TrainResult:
    """The three training rows; on CUDA OOM a row retries with half the micro-batch."""
    import torch

    from relax.backends.torch.batch import build_rollout_tensors

    res = TrainResult(micro_batch=ns.micro_batch)
    samples = make_samples(ns.global_batch, ns.seq_len, ns.prompt_len, _vocab(backend), ns.seed)
    tokens = ns.global_batch * ns.seq_len
    peak = ns.peak_tflops
    megatron = ns.train_backend == "megatron"

    def with_oom_retry(name: str, fn: Callable[[], list[float]]) -> list[float] | None:
        while True:
            retry = False
            try:
                return fn()
            except Exception as exc:  # noqa: BLE001 - OOM retries, anything else is reported in the table
                retry = is_oom(exc) and backend.cfg.micro_batch_size > 1
                if not retry:
                    msg = f"{name}: {type(exc).__name__}: {str(exc)[:300]}"
                    log("FAILED " + msg)
                    res.failures.append(msg)
            # outside the except clause: the traceback (and the activations its frames hold) is gone
            _free_memory(ns.device)
            if not retry:
                return None
            backend.cfg = dataclasses.replace(backend.cfg, micro_batch_size=backend.cfg.micro_batch_size // 2)
            res.micro_batch = backend.cfg.micro_batch_size
            log(f"{name}: CUDA out of memory; retrying with micro-batch {res.micro_batch}")

    def add(name: str, times: list[float] | None, per_token: Callable[[bool], float], note: str) -> None:
        """Tokens/s and MFU twice: full s x s attention (the target row) and causal-halved."""
        if times is None:
            res.rows.append(Row(f"{name} MFU", None, "%", f">= {MFU_TARGET:.0%}", None, "FAILED (see log)"))
            return
        sec = statistics.median(times)
        res.rows.append(Row(f"{name} tokens/s", tokens / sec, "tok/s", note=f"median of {len(times)}: {sec:.3f} s/step"))
        full, causal = per_token(False), per_token(True)
        value = mfu(full, tokens, sec, peak)
        res.rows.append(Row(f"{name} MFU", value, "%", f">= {MFU_TARGET:.0%}", value >= MFU_TARGET,
                            f"{full * tokens / sec / 1e12:,.0f} TFLOP/s model; {note}, full s x s attention"))
        res.rows.append(Row(f"{name} MFU, causal attention", mfu(causal, tokens, sec, peak), "%",
                            note=f"{causal * tokens / sec / 1e12:,.0f} TFLOP/s model; attention term halved"))

    if "rl" not in ns.skip:
        log(f"RL step (train_rollout): {ns.warmup} warm-up + {ns.steps} timed")
        seen: list[dict[str, float]] = []
        times = with_oom_retry("RL step", lambda: time_steps(
            lambda i: seen.append(_checked(backend.train_rollout(samples, i))), ns.warmup, ns.steps, ns.device))
        # one rollout = one optimizer step: train_rollout takes the old log-probs from the step's own forward
        old_forward = not (seen[-1] if seen else {}).get("train/old_log_probs_from_step", 0.0)
        add("RL step (train_rollout)", times, lambda c: flops.rl_step_flops_per_token(ns.seq_len, c, old_forward),
            "8N+16Lhs per token" if old_forward else "6N+12Lhs per token (old log-probs from the step's forward)")
    if "policy" not in ns.skip:
        log(f"policy update (_optimizer_step): {ns.warmup} warm-up + {ns.steps} timed")

        def policy() -> list[float]:
            batch = build_rollout_tensors(samples)
            old_lp = backend._log_probs_no_grad(backend.model, batch)
            adv = torch.tensor([1.0 if s.reward else -1.0 for s in samples]).unsqueeze(1) * batch.loss_mask
            whole = slice(0, len(samples))
            return time_steps(lambda i: _checked(backend._optimizer_step(batch, whole, old_lp, None, adv)),
                              ns.warmup, ns.steps, ns.device)

        add("policy update (fwd+bwd+Adam)", with_oom_retry("policy update", policy),
            lambda c: flops.train_flops_per_token(ns.seq_len, c), "6N+12Lhs per token")
    if "lm" not in ns.skip:
        log(f"LM loss (fwd+bwd+Adam): {ns.warmup} warm-up + {ns.steps} timed")
        ids = torch.tensor([s.tokens for s in samples], device=backend.device)
        times = with_oom_retry("LM loss", lambda: time_steps(
            lambda i: lm_loss_step(backend, ids, backend.cfg.micro_batch_size, megatron), ns.warmup, ns.steps,
            ns.device))
        add("LM loss (fwd+bwd+Adam)", times, lambda c: flops.train_flops_per_token(ns.seq_len, c),
            "Megatron cross-entropy" if megatron else "HF cross-entropy")
    if ns.device == "cuda":
        res.rows.append(Row("peak GPU memory", torch.cuda.max_memory_allocated() / 2**30, "GiB",
                            note=f"micro-batch {res.micro_batch} x {ns.seq_len} tokens"))
    return res


def profile_rl_step(backend: Any, ns: argparse.Namespace) -> dict | None:
    """One `train_rollout` under torch.profiler: the ``--profile`` costliest kernels, grouped by name, to stderr;
    on CUDA also where the GPU waited for the host and what the host ran then (ci/host_stalls.py), returned for the
    JSON."""
    from torch.profiler import ProfilerActivity, profile

    from ci import host_stalls

    samples = make_samples(ns.global_batch, ns.seq_len, ns.prompt_len, _vocab(backend), ns.seed)
    cuda = ns.device == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof, phase_ranges(backend):
        device_sync(ns.device)
        t0 = time.perf_counter()
        _checked(backend.train_rollout(samples, 0))
        device_sync(ns.device)
        wall_s = time.perf_counter() - t0
    if ns.trace:
        prof.export_chrome_trace(ns.trace)
        log(f"chrome trace of the profiled step: {ns.trace}")
    sort = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    log(f"profile of one RL step, top {ns.profile} by {sort}:\n"
        + prof.key_averages().table(sort_by=sort, row_limit=ns.profile, max_name_column_width=90))
    stalls = None
    if cuda:
        kernels, ops = host_stalls.from_profiler(prof)
        stalls = {"traced_wall_s": wall_s, "kernel_s": sum(k.end_us - k.start_us for k in kernels) / 1e6,
                  **host_stalls.charge(kernels, ops, top=ns.profile), "phases": host_stalls.by_phase(kernels, ops)}
        log(f"traced step {wall_s:.3f} s, kernels {stalls['kernel_s']:.3f} s; " + host_stalls.describe(stalls) + "\n"
            + host_stalls.describe_phases(stalls["phases"]))
    del prof
    _free_memory(ns.device)
    return stalls


@contextlib.contextmanager
def phase_ranges(backend: Any):
    """``phase:<name>`` profiler ranges around the RL step's parts (`host_stalls.by_phase`): the policy loss, the
    gradient step (Megatron's grad finalize, norm and Adam), the zeroing of the gradients, and the passes: with the
    Megatron backend its schedule's forward + backward (`StageRunner.run`: the two interleave inside megatron-core,
    so they are one phase; ci/trace_kernels.py splits them in a trace), with the torch backend the forward with its
    log-probs and the backward apart. Instance attributes shadow the backend's methods while profiling."""
    import torch
    from torch.profiler import record_function

    from ci.host_stalls import PHASE

    def ranged(fn, label: str):
        def call(*args, **kwargs):
            with record_function(PHASE + label):
                return fn(*args, **kwargs)
        return call

    names = {"_forward_log_probs": "forward", "_micro_batch_loss": "loss", "_apply_gradients": "optimizer",
             "_zero_grad": "zero_grad"}
    backward = torch.Tensor.backward
    for name, label in names.items():
        setattr(backend, name, ranged(getattr(backend, name), label))
    runner = getattr(backend, "runner", None)  # the Megatron backend's StageRunner
    if runner is not None:
        runner.run = ranged(runner.run, "forward+backward")
    torch.Tensor.backward = ranged(backward, "backward")
    try:
        yield
    finally:
        torch.Tensor.backward = backward
        if runner is not None:
            del runner.run
        for name in names:
            delattr(backend, name)


def _checked(metrics: dict[str, float]) -> dict[str, float]:
    grad_norm = metrics.get("train/grad_norm", metrics.get("grad_norm"))
    if grad_norm is not None and not math.isfinite(grad_norm):
        raise FloatingPointError(f"non-finite grad norm {grad_norm}")
    return metrics


# ---------------------------------------------------------------------------------------------- sync rows
def hf_export(backend: Any) -> dict[str, Any]:
    """HF-named tensors on the backend's device: the Megatron backend's own export, else the HF state dict."""
    if hasattr(backend, "hf_state"):
        return backend.hf_state()
    return {k: v.detach() for k, v in backend.model.state_dict().items()}


def tensor_bytes(named: dict[str, Any]) -> int:
    return sum(t.numel() * t.element_size() for t in named.values())


@dataclass
class SyncResult:
    rows: list[Row] = field(default_factory=list)
    checksums_equal: dict[str, bool] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)


def _mismatches(trainer: dict[str, str], engine: dict[str, str]) -> list[str]:
    return sorted(k for k in set(trainer) | set(engine) if trainer.get(k) != engine.get(k))


def run_sync_rows(backend: Any, engine: Any, ns: argparse.Namespace) -> SyncResult:
    """Time both colocate sync paths and check the engine's checksums equal the trainer's after each."""
    import torch

    res = SyncResult()
    gigabytes = tensor_bytes(hf_export(backend)) / 1e9
    t0 = time.perf_counter()
    trainer_sums = backend.checksums()
    t_checksum = time.perf_counter() - t0
    version = iter(range(1, 1 << 30))

    def direct() -> None:
        engine.update_weights_from_tensors(list(hf_export(backend).items()), version=next(version))

    def via_cpu() -> None:
        v = next(version)
        for bucket in backend.weight_buckets(ns.bucket_mb * 2**20):
            engine.update_weights_from_tensors([(name, t.cpu()) for name, t in bucket], version=v)

    def clobber_engine() -> None:
        with torch.no_grad():
            for p in engine.model.parameters():
                p.zero_()

    paths = [("via CPU buckets", via_cpu, f"weight_buckets({ns.bucket_mb} MiB): relax train's path, Ray excluded"),
             ("direct GPU tensors", direct, "hf_state() -> update_weights_from_tensors, in-process")]
    for name, fn, note in paths:
        clobber_engine()  # every tensor differs before the sync (the engine's own init shares e.g. the norms)
        before = _mismatches(trainer_sums, engine.weight_checksums())
        try:
            times = [timed(fn, ns.device) for _ in range(ns.sync_repeats + 1)][1:]
        except Exception as exc:  # noqa: BLE001
            msg = f"sync {name}: {type(exc).__name__}: {str(exc)[:300]}"
            log("FAILED " + msg)
            res.failures.append(msg)
            res.rows.append(Row(f"sync {name}", None, "s/GB", f"<= {SYNC_TARGET_S_PER_GB}", None, "FAILED (see log)"))
            continue
        after = _mismatches(trainer_sums, engine.weight_checksums())
        res.checksums_equal[name] = not after
        sec = statistics.median(times)
        res.rows.append(Row(f"sync {name}", sec / gigabytes, "s/GB", f"<= {SYNC_TARGET_S_PER_GB}",
                            sec / gigabytes <= SYNC_TARGET_S_PER_GB,
                            f"{sec:.3f} s for {gigabytes:.2f} GB; {note}"))
        res.rows.append(Row(f"  tensors unequal after sync {name}", float(len(after)), "tensors", "0", not after,
                            f"{len(before)} of {len(trainer_sums)} differed before the sync"
                            + (f"; still differ: {after[:3]}" if after else "; checksums equal")))
        if after:
            res.failures.append(f"sync {name}: {len(after)} tensors differ after the sync, e.g. {after[:3]}")
    res.rows.append(Row("checksums of one side (per sync)", t_checksum, "s",
                        note=f"{len(trainer_sums)} tensors, digest where they live (relax/weights/checksum.py); "
                             "relax train does both sides each sync"))
    return res


# ---------------------------------------------------------------------------------------------- main
def build_backend(ns: argparse.Namespace, output_dir: str) -> Any:
    from relax.backends.config import TrainerConfig
    from relax.backends.train_registry import build_train_backend
    from relax.utils.arguments import parse_args

    args = parse_args(backend_argv(ns, output_dir))
    if ns.train_backend == "megatron":
        from relax.backends.megatron import model as mcore_model

        mcore_model.DEFAULT_ATTENTION = ns.attention  # what build_gpt_model uses for the local spec
    return build_train_backend(TrainerConfig.from_args(args), ns.device)


def build_engine(ns: argparse.Namespace) -> Any:
    from relax.backends.embedded.engine import EmbeddedEngine
    from relax.backends.train_registry import weight_dtype
    from relax.models import build_model

    model = build_model(ns.model, dtype=weight_dtype(ns.train_backend), seed=ns.seed + 1).to(ns.device).eval()
    return EmbeddedEngine(model, eos_token_ids=[], device=ns.device)


def header_lines(ns: argparse.Namespace, flops: FlopModel, backend: Any, micro_batch: int) -> list[str]:
    import torch

    desc = backend.describe() if backend is not None else {}
    dev = torch.cuda.get_device_name() if ns.device == "cuda" else "cpu"
    opt = "distributed optimizer" if not ns.no_distributed_optimizer else "plain optimizer"
    precision = "bf16 (fp32 grads, main params, Adam)" if ns.train_backend == "megatron" else "fp32"
    return [
        f"bench_megatron: {ns.model} ({_count(flops.total_params)} params, N = {_count(flops.matmul_params)} in "
        f"matmuls, {flops.layers} layers, attention width {flops.attn_width}), {ns.train_backend} backend "
        f"({desc.get('layer_spec', '-')} layer spec"
        + (f", {ns.attention} attention" if desc.get("layer_spec") == "local" else "") + f"), {precision}, {opt}",
        f"{ns.global_batch} x {ns.seq_len} = {ns.global_batch * ns.seq_len:,} tokens per step (prompt {ns.prompt_len}), "
        f"micro-batch {micro_batch}, {ns.warmup} warm-up + {ns.steps} timed steps; {dev}, peak {ns.peak_tflops:g} "
        f"TFLOP/s; torch {torch.__version__}" + (f", megatron-core {_mcore_version()}" if ns.train_backend == "megatron"
                                                else ""),
    ]


def _count(n: int) -> str:
    return f"{n / 1e9:.2f}B" if n >= 1e9 else f"{n / 1e6:.1f}M" if n >= 1e6 else f"{n / 1e3:.1f}k"


def _mcore_version() -> str:
    try:
        from megatron.core import __version__
    except ImportError:
        return "?"
    return __version__


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    reason = preflight(ns)
    if reason:
        print(f"bench_megatron: {reason}", file=sys.stderr)
        return 2
    import torch

    from relax.models import build_config

    t_start = time.perf_counter()
    flops = FlopModel.from_hf_config(build_config(ns.model))
    rows: list[Row] = []
    failures: list[str] = []
    backend = None
    profile = None
    micro_batch = ns.micro_batch
    with tempfile.TemporaryDirectory(prefix="bench_megatron_") as tmp:
        try:
            log(f"building the {ns.train_backend} backend for {ns.model}")
            t0 = time.perf_counter()
            backend = build_backend(ns, tmp)
            log(f"backend ready in {time.perf_counter() - t0:.1f} s: {backend.describe()}")
        except Exception as exc:  # noqa: BLE001 - nothing else can run; say why
            failures.append(f"building the backend: {type(exc).__name__}: {exc}")
        if backend is not None:
            train = run_train_rows(backend, ns, flops)
            rows += train.rows
            failures += train.failures
            micro_batch = train.micro_batch
            if ns.profile:
                profile = profile_rl_step(backend, ns)
            if "sync" not in ns.skip:
                try:
                    log("building the embedded engine")
                    _free_memory(ns.device)
                    engine = build_engine(ns)
                    log("timing the weight sync")
                    sync = run_sync_rows(backend, engine, ns)
                    rows += sync.rows
                    failures += sync.failures
                    del engine
                except Exception as exc:  # noqa: BLE001
                    failures.append(f"weight sync: {type(exc).__name__}: {str(exc)[:300]}")
    elapsed = time.perf_counter() - t_start
    rows.append(Row("wall time of this script", elapsed, "s", "< 300", elapsed < 300))
    table = format_table(header_lines(ns, flops, backend, micro_batch), rows)
    print(table)
    for f in failures:
        print(f"FAILED: {f}")
    if ns.json:
        from ci.provenance import provenance

        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({"provenance": provenance(), "setup": {k: v for k, v in vars(ns).items()} | {
            "micro_batch_used": micro_batch, "device": torch.cuda.get_device_name() if ns.device == "cuda" else "cpu",
            "total_params": flops.total_params, "matmul_params": flops.matmul_params},
            "rows": [asdict(r) for r in rows], "host_stalls": profile, "failures": failures}, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
