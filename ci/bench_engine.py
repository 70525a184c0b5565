"""Embedded engine vs HF ``generate`` on bench-270m: decode tokens/s against the HBM roofline, and the
bf16 train/rollout log-prob mismatch.

    python ci/bench_engine.py [--batches 64 256] [--prompt 128] [--new 256] [--runners hf ... lean+graph+compile]
    python ci/bench_engine.py --json /tmp/out/bench_engine.json          # also the rows + provenance as JSON
    python ci/bench_engine.py --profile ...   # + where each engine row's decode time goes (ci/decode_profile.py)
    python ci/bench_engine.py --runners lean+graph+compile sglang --no-hf   # + a real SGLang server (ci/bench_sglang.py)
    python ci/bench_engine.py --device cpu --model tiny-qwen3 --batches 4 --prompt 8 --new 8 \\
        --runners hf lean                                                # CPU smoke (numbers mean nothing)

Workload from MACHINES.md: random-init bench-270m (Qwen3, 267M params, bf16), ``--batches`` rows of
random ``--prompt``-token prompts (seeded, the same in every process), ``--new`` sampled tokens each
(temperature 1), EOS disabled so every row decodes the full length.

Every (runner, batch) is measured in a fresh subprocess (``--in-process`` measures them one after the
other in this process instead): a runner's figure must not depend on what ran before it, and in one
process it did (MACHINES.md: the compiled lean runner fell from 41.2k to 16.5k tok/s after the other
runners). ``--order`` runs them in the given, reversed or a seeded shuffled order, to show it. The ``sglang``
runner (ci/bench_sglang.py: a real SGLang server on the same weights and prompts, driven through ``/generate`` as
the rollout drives it) is measured after the others, one server for every batch; the run then prints each
runner's tok/s over SGLang's at the same batch (``embedded_over_sglang`` in the JSON).

Roofline: one decode step reads every weight once and each row's KV cache (its average context,
``prompt + new / 2`` tokens, of K and V in every layer), so
``roofline tok/s = batch / ((weight bytes + batch * avg context * KV bytes per token) / HBM bytes/s)``.
HBM bandwidth: the device's spec (`HBM_TBPS`: 3.35 TB/s for the H100 SXM, 4.8 for the H200), or
``--hbm-tbps``. Per runner, the mean/max |engine log-prob - trainer log-prob| with both sides in the
model dtype on the same weights, the memory the engine holds and frees on release, and (GPU) the same
generate again right after a release + resume, as a colocate rollout runs it: its tok/s and the CUDA
graphs the lean runner had to capture again.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # ci.provenance when run as a script
from ci import bench_sglang, decode_profile, host_stalls  # noqa: E402
from ci.bench_sglang import SGLANG  # noqa: E402
from ci.provenance import provenance  # noqa: E402
from relax.utils.gc_pauses import freeze_startup_objects  # noqa: E402

RUNNERS = {"hf": dict(runner="hf"), "static": dict(runner="static"), "static+graph": dict(runner="static", cuda_graph=True),
           "lean": dict(runner="lean"), "lean+graph": dict(runner="lean", cuda_graph=True),
           "lean+graph+compile": dict(runner="lean", cuda_graph=True, compile=True),
           "lean+graph+autotune": dict(runner="lean", cuda_graph=True, compile=True,
                                       compile_mode="max-autotune-no-cudagraphs")}
DEFAULT_RUNNERS = [name for name in RUNNERS if name != "lean+graph+autotune"]
"""Every runner but the autotuned one, whose compile benchmarks GEMM configs for minutes: name it to run it."""
HF_GENERATE = "HF generate"
HBM_TBPS = {"H100 80GB HBM3": 3.35, "H100 SXM": 3.35, "H100 NVL": 3.9, "H100 PCIe": 2.0, "H200": 4.8}
"""Spec HBM bandwidth (TB/s) by a substring of ``torch.cuda.get_device_name()``; the first match wins."""
ROOFLINE_TARGET = 0.40
RESULT_PREFIX = "BENCH_ENGINE_RESULT "


@dataclass
class Row:
    """One (runner, batch) measurement."""

    runner: str
    batch: int
    tokens_per_s: float | None = None  # engine rows: over the median of the timed runs' walls (``--repeats``)
    walls_s: list[float] | None = None  # engine rows: every timed run's wall, in run order
    full_gc_s: list[float] | None = None  # engine rows: seconds of full (gen-2) garbage collections in each timed run
    mismatch_mean: float | None = None
    mismatch_max: float | None = None
    held_gib: float | None = None
    freed_gib: float | None = None
    release_s: float | None = None
    resume_s: float | None = None
    resumed_tokens_per_s: float | None = None  # the same generate right after release + resume (what colocate pays)
    resumed_captures: int | None = None  # CUDA graphs the lean runner captured during it (0: it replayed its own)
    resumed_capture_s: float | None = None  # seconds those captures took (warm-up step included)
    profile: dict | None = None
    server_s: list[float | None] | None = None  # sglang rows: SGLang's own seconds (meta_info e2e_latency) per timed run
    error: str = ""


# ---------------------------------------------------------------------------------------------- roofline
def hbm_tbps(device_name: str) -> float | None:
    return next((tbps for key, tbps in HBM_TBPS.items() if key in device_name), None)


def decode_roofline(config: Any, weight_bytes: int, batch: int, prompt: int, new: int, tbps: float,
                    dtype_bytes: int = 2) -> float:
    """Tokens/s if a decode step only had to read the weights and every row's KV cache once."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_per_token = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * dtype_bytes
    step_bytes = weight_bytes + batch * (prompt + new / 2) * kv_per_token
    return batch / (step_bytes / (tbps * 1e12))


# ---------------------------------------------------------------------------------------------- one measurement
def _sync(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn, device: str) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


class FullCollections:
    """Seconds Python's cyclic garbage collector spends in full (generation 2) collections while active. Why: a full
    collection walks every tracked object (hundreds of thousands after torch.compile), so one that lands inside a
    timed generate stalls its host loop; the row's ``full_gc_s`` says which walls carry one. `measure` freezes what
    the warm-ups left (`relax.utils.gc_pauses.freeze_startup_objects`), as a training run does after its first
    steps, so those walks cover only what the timed generates allocate."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._start = 0.0

    def _callback(self, phase: str, info: dict) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.seconds += time.perf_counter() - self._start

    def __enter__(self) -> FullCollections:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)


def workload(ns: argparse.Namespace, batch: int, model: Any = None) -> tuple[Any, Any]:
    """The model (``model`` when given: the one this returned before) and ``batch`` prompts, identical in every
    process (seeded on the CPU)."""
    import torch

    from relax.models import build_model

    dtype = torch.bfloat16 if ns.device == "cuda" else torch.float32
    if model is None:
        model = build_model(ns.model, dtype=dtype, seed=0).to(ns.device).eval()
    gen = torch.Generator().manual_seed(1234 + batch)
    prompts = torch.randint(3, model.config.vocab_size, (batch, ns.prompt), generator=gen).to(ns.device)
    return model, prompts


def engine_requests(prompts: Any, new: int, seed0: int) -> list[dict]:
    return [{"input_ids": p.tolist(), "return_logprob": True,
             "sampling_params": {"temperature": 1.0, "max_new_tokens": new, "sampling_seed": seed0 + i}}
            for i, p in enumerate(prompts)]


def mismatch(model, requests: list[dict], responses: list[dict], device: str) -> tuple[float, float]:
    import torch

    from relax.backends.torch.batch import TrainSample, build_model_inputs, build_rollout_tensors
    from relax.backends.torch.logprobs import response_log_probs

    samples = [TrainSample(tokens=r["input_ids"] + o["output_ids"], response_length=len(o["output_ids"]),
                           loss_mask=[1] * len(o["output_ids"]), reward=0.0,
                           rollout_log_probs=[x[0] for x in o["meta_info"]["output_token_logprobs"]])
               for r, o in zip(requests, responses, strict=True)]
    batch = build_rollout_tensors(samples)
    diffs = []
    for i in range(0, len(samples), 16):
        inputs = build_model_inputs(samples[i : i + 16], batch.loss_mask.shape[1], 0, device)
        with torch.no_grad():
            lp, _ = response_log_probs(model, inputs, temperature=1.0, with_entropy=False)
        mask = batch.loss_mask[i : i + 16].to(device)
        diffs.append(((lp - batch.rollout_log_probs[i : i + 16].to(device)).abs() * mask)[mask > 0])
    d = torch.cat(diffs)
    return float(d.mean()), float(d.max())


def measure(ns: argparse.Namespace, runner: str, batch: int) -> Row:
    """``runner`` (or HF generate) at ``batch`` rows, in this process."""
    import torch

    from relax.backends.embedded.engine import EmbeddedEngine

    model, prompts = workload(ns, batch)
    row = Row(runner, batch)
    tokens = batch * ns.new
    if runner == HF_GENERATE:
        def run() -> None:
            model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0, top_k=0,
                           max_new_tokens=ns.new, min_new_tokens=ns.new, eos_token_id=None, pad_token_id=0)

        run()  # warm-up
        row.tokens_per_s = tokens / timed(run, ns.device)
        return row
    engine = EmbeddedEngine(model, eos_token_ids=[], device=ns.device, max_context_len=ns.prompt + ns.new + 8,
                            max_running_requests=batch, **RUNNERS[runner])
    engine.generate(engine_requests(prompts[:4], 8, 10_000))  # warm-up / graph capture
    engine.generate(engine_requests(prompts, ns.new, 20_000))
    freeze_startup_objects()  # as `relax train` does after its first steps (relax/utils/gc_pauses.py)
    try:
        return _measure_engine(ns, engine, model, prompts, row, tokens)
    finally:
        gc.unfreeze()  # the next in-process measurement's collections reach this engine again


def _measure_engine(ns: argparse.Namespace, engine: Any, model: Any, prompts: Any, row: Row, tokens: int) -> Row:
    """`measure`'s timed part, after the warm-ups."""
    from relax.backends.embedded.device_region import held_bytes

    reqs = engine_requests(prompts, ns.new, 0)
    holder: dict[str, Any] = {}
    row.walls_s, row.full_gc_s = [], []
    for _ in range(ns.repeats):
        with FullCollections() as collections:
            row.walls_s.append(timed(lambda: holder.update(out=engine.generate(reqs)), ns.device))
        row.full_gc_s.append(collections.seconds)
    row.tokens_per_s = tokens / statistics.median(row.walls_s)
    row.mismatch_mean, row.mismatch_max = mismatch(model, reqs, holder["out"], ns.device)
    if ns.profile:  # one more run, traced (ci/decode_profile.py); the timed runs above were not
        try:
            row.profile = decode_profile.profile(lambda: engine.generate(reqs), ns.device, host_stalls.charge)
            # tracing slows the host (on the H100 at batch 256: 1.66 s traced vs 0.76 s timed), so the busy
            # share that tells host-bound from kernel-bound is the kernels' time over the *timed* run's wall
            row.profile["timed_wall_s"] = tokens / row.tokens_per_s
            row.profile["busy_share_of_timed_run"] = row.profile["busy_s"] / row.profile["timed_wall_s"]
        except Exception as exc:  # noqa: BLE001 - a profiler failure must not cost the row its measured figures
            row.profile = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
    if ns.device == "cuda":
        saved = {k: v.cpu() for k, v in model.state_dict().items()}  # the weight sync a colocate step runs
        row.held_gib = held_bytes(engine.device) / 2**30
        row.release_s = timed(engine.release_memory_occupation, ns.device)
        row.freed_gib = row.held_gib - held_bytes(engine.device) / 2**30
        row.resume_s = timed(engine.resume_memory_occupation, ns.device)
        engine.update_weights_from_tensors(saved)  # released without a CPU backup (SGLang's default): not timed
        counts = (getattr(engine.runner, "captures", 0), getattr(engine.runner, "capture_s", 0.0))
        row.resumed_tokens_per_s = tokens / timed(lambda: engine.generate(reqs), ns.device)
        row.resumed_captures = getattr(engine.runner, "captures", 0) - counts[0]
        row.resumed_capture_s = getattr(engine.runner, "capture_s", 0.0) - counts[1]
    return row


def measure_safely(ns: argparse.Namespace, runner: str, batch: int) -> Row:
    try:
        return measure(ns, runner, batch)
    except Exception as exc:  # noqa: BLE001 - a runner that fails is a row with its error; the others go on
        return Row(runner, batch, error=f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}")


def measure_in_subprocess(ns: argparse.Namespace, runner: str, batch: int) -> Row:
    """The same measurement in a fresh Python process: nothing that ran before can touch it."""
    argv = [sys.executable, str(Path(__file__).resolve()), "--worker", runner, "--worker-batch", str(batch),
            "--device", ns.device, "--model", ns.model, "--prompt", str(ns.prompt), "--new", str(ns.new),
            "--runners", *ns.runners, "--repeats", str(ns.repeats)] + (["--profile"] if ns.profile else [])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=ns.timeout)
    except subprocess.TimeoutExpired:
        return Row(runner, batch, error=f"no result within {ns.timeout:g} s (--timeout)")
    lines = [line for line in proc.stdout.splitlines() if line.startswith(RESULT_PREFIX)]
    if not lines:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1][:200]
        return Row(runner, batch, error=f"worker exit {proc.returncode}: {tail}")
    return Row(**json.loads(lines[-1][len(RESULT_PREFIX):]))


# ---------------------------------------------------------------------------------------------- the run
def ordered(names: list[str], order: str, seed: int) -> list[str]:
    if order == "reversed":
        return names[::-1]
    if order == "shuffled":
        shuffled = list(names)
        random.Random(seed).shuffle(shuffled)
        return shuffled
    return list(names)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="bench-270m", help="model preset (relax.models.PRESETS)")
    ap.add_argument("--batches", type=int, nargs="+", default=[64, 256], help="decode batch sizes, a row each")
    ap.add_argument("--prompt", type=int, default=128, help="tokens per prompt")
    ap.add_argument("--new", type=int, default=256, help="sampled tokens per row")
    ap.add_argument("--runners", nargs="+", default=DEFAULT_RUNNERS, choices=[*RUNNERS, SGLANG],
                    help=f"engine runners; {SGLANG}: a real SGLang server (ci/bench_sglang.py), not in the default")
    ap.add_argument("--order", default="given", choices=["given", "reversed", "shuffled"],
                    help="the order the runners are measured in (HF generate first either way)")
    ap.add_argument("--seed", type=int, default=0, help="--order shuffled's seed")
    ap.add_argument("--no-hf", action="store_true",
                    help="leave out the HF generate rows (the 'vs HF' column stays empty): for engine-only comparisons")
    ap.add_argument("--in-process", action="store_true",
                    help="measure every runner in this process, one after the other (default: a fresh process each)")
    ap.add_argument("--hbm-tbps", type=float, default=None,
                    help="HBM bandwidth for the roofline (default: the device's spec, HBM_TBPS)")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: the smoke path (fp32)")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per measurement subprocess")
    ap.add_argument("--repeats", type=int, default=5,
                    help="timed generates per engine row; its tok/s is over their median wall, the note gives the "
                         "slowest and fastest (HF generate: one)")
    ap.add_argument("--profile", action="store_true",
                    help="after each engine row's timed runs, one more run under torch.profiler: GPU-busy share of "
                         "the wall time and the heaviest kernels (ci/decode_profile.py), printed and in the JSON")
    ap.add_argument("--json", default=None, help="also write the rows, the roofline and the provenance here")
    bench_sglang.add_arguments(ap)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # internal: one measurement
    ap.add_argument("--worker-batch", type=int, default=None, help=argparse.SUPPRESS)
    return ap


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = build_parser()
    ns = ap.parse_args(argv)
    if min(*ns.batches, ns.prompt, ns.new, ns.repeats) < 1:
        ap.error("--batches, --prompt, --new and --repeats must be >= 1")
    if ns.hbm_tbps is not None and ns.hbm_tbps <= 0:
        ap.error("--hbm-tbps must be > 0")
    graphs = [r for r in ns.runners if RUNNERS.get(r, {}).get("cuda_graph")]
    if ns.device == "cpu" and graphs:
        ap.error(f"--device cpu: CUDA graphs need a GPU ({', '.join(graphs)})")
    problem = bench_sglang.check_arguments(ns)
    if problem:
        ap.error(problem)
    ns.runners = list(dict.fromkeys(ns.runners))
    ns.batches = list(dict.fromkeys(ns.batches))
    return ns


def device_and_bandwidth(ns: argparse.Namespace) -> tuple[str, float | None, str]:
    """(device name, TB/s, where the TB/s comes from); TB/s None on a GPU without a known spec."""
    import torch

    if ns.device == "cpu":
        return "cpu", ns.hbm_tbps, "--hbm-tbps" if ns.hbm_tbps else "none (CPU)"
    name = torch.cuda.get_device_name()
    if ns.hbm_tbps:
        return name, ns.hbm_tbps, "--hbm-tbps"
    spec = hbm_tbps(name)
    return name, spec, "device spec (HBM_TBPS)" if spec else "unknown"


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _spread(row: Row) -> str:
    """The timed runs' range, ``median of N (slowest-fastest tok/s)``, for rows timed more than once."""
    if not row.walls_s or len(row.walls_s) < 2:
        return ""
    tokens = row.tokens_per_s * statistics.median(row.walls_s)
    return (f"median of {len(row.walls_s)} ({tokens / max(row.walls_s):,.0f}-{tokens / min(row.walls_s):,.0f})")


def table(rows: list[Row], roofline: dict[int, float | None]) -> str:
    base = {r.batch: r.tokens_per_s for r in rows if r.runner == HF_GENERATE}
    out = [f"| {'runner':<20} | {'batch':>5} | {'tok/s':>9} | {'vs HF':>6} | {'% roofline':>10} | "
           f"{'mean |dlogp|':>12} | {'max |dlogp|':>11} | {'held GiB':>8} | {'freed GiB':>9} | note |",
           "|" + "|".join(["-" * 22, "-" * 6 + ":", "-" * 10 + ":", "-" * 7 + ":", "-" * 11 + ":", "-" * 13 + ":",
                           "-" * 12 + ":", "-" * 9 + ":", "-" * 10 + ":", "------"]) + "|"]
    for r in rows:
        vs = r.tokens_per_s / base[r.batch] if r.tokens_per_s and base.get(r.batch) else None
        share = 100 * r.tokens_per_s / roofline[r.batch] if r.tokens_per_s and roofline.get(r.batch) else None
        out.append(f"| {r.runner:<20} | {r.batch:>5} | {_fmt(r.tokens_per_s, ',.0f'):>9} | "
                   f"{_fmt(vs, '.1f') + ('x' if vs else ''):>6} | {_fmt(share, '.1f'):>10} | "
                   f"{_fmt(r.mismatch_mean, '.2e'):>12} | {_fmt(r.mismatch_max, '.2e'):>11} | "
                   f"{_fmt(r.held_gib, '.2f'):>8} | {_fmt(r.freed_gib, '.2f'):>9} | {r.error or _spread(r)} |")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ns = parse(argv)
    if ns.worker:
        print(RESULT_PREFIX + json.dumps(asdict(measure_safely(ns, ns.worker, ns.worker_batch))), flush=True)
        return 0
    import torch

    from relax.models import PRESETS, build_config, build_model

    if ns.model not in PRESETS:
        print(f"bench_engine: --model {ns.model!r}: choose one of {', '.join(PRESETS)}", file=sys.stderr)
        return 2
    if ns.device == "cuda" and not torch.cuda.is_available():
        print("bench_engine: needs a CUDA GPU (--device cpu runs the smoke path)", file=sys.stderr)
        return 2
    device, tbps, source = device_and_bandwidth(ns)
    if ns.device == "cuda" and tbps is None:
        print(f"bench_engine: no HBM spec known for {device!r}: pass --hbm-tbps", file=sys.stderr)
        return 2
    cfg = build_config(ns.model)
    dtype_bytes = 2 if ns.device == "cuda" else 4  # bf16 on the GPU, fp32 on the CPU smoke
    with torch.device("meta"):  # the parameter count without allocating the model
        weight_bytes = sum(p.numel() for p in build_model(ns.model, seed=0).parameters()) * dtype_bytes
    roofline = {b: decode_roofline(cfg, weight_bytes, b, ns.prompt, ns.new, tbps, dtype_bytes) if tbps else None
                for b in ns.batches}
    names = [HF_GENERATE] * (not ns.no_hf) + ordered([r for r in ns.runners if r != SGLANG], ns.order, ns.seed)
    run = measure_safely if ns.in_process else measure_in_subprocess
    rows = []
    t0 = time.perf_counter()
    origin = provenance() if ns.json else None
    setup = {k: v for k, v in vars(ns).items() if not k.startswith("worker")}

    def write_json(complete: bool) -> None:
        if not ns.json:
            return
        Path(ns.json).parent.mkdir(parents=True, exist_ok=True)
        Path(ns.json).write_text(json.dumps({
            "provenance": origin, "setup": setup, "device": device, "hbm_tbps": tbps, "hbm_source": source,
            "weight_bytes": weight_bytes, "roofline_tok_s": {str(b): v for b, v in roofline.items()},
            "roofline_target": ROOFLINE_TARGET, "rows": [asdict(r) for r in rows], "complete": complete,
            "embedded_over_sglang": {str(b): v for b, v in bench_sglang.ratios(rows, (HF_GENERATE,)).items()},
            "wall_s": time.perf_counter() - t0}, indent=1))

    for batch in ns.batches:
        for name in names:
            print(f"[bench_engine] {name} at batch {batch} ({'in process' if ns.in_process else 'own process'})",
                  file=sys.stderr, flush=True)
            rows.append(run(ns, name, batch))
            r = rows[-1]  # each row as it lands, and the JSON so far: a run cut short keeps what it measured
            print(f"[bench_engine]   {r.error or f'{r.tokens_per_s:,.0f} tok/s'}", file=sys.stderr, flush=True)
            write_json(complete=False)
    if SGLANG in ns.runners:  # after the others: one server for every batch, stopped before the table
        print(f"[bench_engine] {bench_sglang.describe(ns)}", file=sys.stderr, flush=True)
        rows.extend(bench_sglang.measure_rows(ns, Row, workload, mismatch,
                                              log=lambda m: print(m, file=sys.stderr, flush=True)))
        order = [*names, SGLANG]
        rows.sort(key=lambda r: (ns.batches.index(r.batch), order.index(r.runner)))
        write_json(complete=False)
    print(f"\n{ns.model}, prompt {ns.prompt}, {ns.new} new tokens, {device}, runners in {ns.order} order, "
          f"{'one process' if ns.in_process else 'a fresh process each'}")
    for b in ns.batches:
        if roofline[b]:
            print(f"roofline at batch {b}: {roofline[b]:,.0f} tok/s ({tbps} TB/s, {source}; weights + KV cache "
                  f"per decode step); target {ROOFLINE_TARGET:.0%} = {ROOFLINE_TARGET * roofline[b]:,.0f} tok/s")
    print(table(rows, roofline))
    for line in bench_sglang.ratio_lines(bench_sglang.ratios(rows, (HF_GENERATE,))):
        print(line)
    for r in rows:
        if r.server_s and r.walls_s and None not in r.server_s:
            print(f"SGLang's own time at batch {r.batch}: {statistics.median(r.server_s):.3f} s of a "
                  f"{statistics.median(r.walls_s):.3f} s wall (median; the rest: HTTP, tokenizer manager, client)")
    for r in rows:
        if r.resumed_tokens_per_s:
            print(f"after release + resume, {r.runner} at batch {r.batch}: {r.resumed_tokens_per_s:,.0f} tok/s "
                  f"({r.resumed_tokens_per_s / r.tokens_per_s:.2f}x the steady run; {r.resumed_captures} CUDA graphs "
                  f"captured in {r.resumed_capture_s:.3f} s)")
        if r.profile:
            told = r.profile.get("error") or decode_profile.describe(r.profile)
            print(f"profile of {r.runner} at batch {r.batch}: {told}")
    write_json(complete=True)
    return 1 if any(r.error for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
