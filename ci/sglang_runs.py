"""Issue "Real SGLang" runs 1 and 3: ``relax train`` with a real SGLang 0.5.14 server, and the same run with the
embedded engine, summarised from each run's own artifacts.

    python ci/sglang_runs.py colocate --model bench-270m --engines sglang embedded --steps 10 --json OUT.json
    python ci/sglang_runs.py colocate-tp2 --steps 10 --json OUT.json   # 2 GPUs: Megatron TP 2, an engine of both
    python ci/sglang_runs.py async --model small-qwen3 --steps 10 --json OUT.json       # 2 GPUs: trainer, engine
    python ci/sglang_runs.py external --model small-qwen3 --steps 10 --json OUT.json    # 2 GPUs: trainer, server
    python ci/sglang_runs.py vlm --steps 10 --json OUT.json    # issue 44: the VLM preset, SGLang then embedded

``colocate``: Megatron and the engine share one GPU (``--colocate``): weights by ``/update_weights_from_tensor``
(CUDA IPC), memory by ``/release_memory_occupation`` / ``/resume_memory_occupation``. ``colocate-tp2``: the same on
two GPUs, Megatron at TP 2 and one engine of both GPUs (its second rank opens the first GPU's handle). ``async``: ``--fully-async``
with the trainer on the first visible GPU and the engine on the second: weights by ``/init_weights_update_group``
+ ``/update_weights_from_distributed`` (NCCL). ``external``: an SGLang server this script starts by hand on the
second GPU, driven with ``--rollout-external``. ``vlm`` (issue 44): ``relax train --preset vlm-quickstart`` (the torch
trainer colocated with the engine on one GPU, so weights go by ``/init_weights_update_group`` +
``/update_weights_from_distributed`` over gloo from the offloaded trainer's host copy) with ``--model``'s VLM
(tiny-qwen2.5-vl-p14: SGLang 0.5.14 runs Qwen2.5-VL's vision tower only on 14-pixel patches), 16-token answers,
``--bf16`` (SGLang's kernels are run in bf16 here; ``--fp32`` drops it), first with real SGLang (`VLM_SGLANG_FLAGS`
add the vision attention: SGLang's Hopper default is FA3, which this machine's sgl_kernel lacks), then with the
embedded engine. Every run has ``--check-weight-update-equal`` (the engine's
tensors are noise before each sync, so a tensor a sync misses cannot match), and its weights.jsonl is judged by
the harness's ``weight_equality`` check: for a stock SGLang server, SGLang's own ``/weights_checker`` hashes
of its parameters against the trainer's hashes of the bytes it sent (relax/weights/sglang_checksums.py).

Per run the JSON holds: the check's verdict, the sync transports and medians (ci/run_figures.py), the reward of
the first and last steps, and the train/rollout log-prob mismatch (``train/train_rollout_logprob_abs_diff``
and its max, ``train/train_rollout_kl``), so SGLang and the embedded engine stand side by side on one config.
SGLang comes from ``RELAX_SGLANG_PYTHONPATH`` (default /tmp/sglsite: ci/wheelhouse/install_sglang.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from ci.provenance import provenance  # noqa: E402
from ci.run_figures import read_jsonl, step_phases  # noqa: E402

SITE = os.environ.get("RELAX_SGLANG_PYTHONPATH", "/tmp/sglsite")
# what runs on this GPU machine: the repacked sgl_kernel has no FA3, xgrammar is not staged (ci/wheelhouse)
SGLANG_FLAGS = ["--sglang-attention-backend", "triton", "--sglang-grammar-backend", "none",
                "--sglang-sampling-backend", "pytorch", "--sglang-mem-fraction-static", "0.3",
                "--sglang-cuda-graph-max-bs-decode", "64"]
SERVER_FLAGS = ["--attention-backend", "triton", "--grammar-backend", "none", "--sampling-backend", "pytorch",
                "--mem-fraction-static", "0.3", "--cuda-graph-max-bs", "64"]
# a vision-language model on this GPU machine: the vision tower's attention in torch SDPA (0.5.14 picks fa3 on Hopper);
# piecewise prefill graphs are off for a VLM anyway (server_args.py), the flag spares their compile check
VLM_SGLANG_FLAGS = ["--sglang-mm-attention-backend", "sdpa", "--sglang-disable-prefill-cuda-graph"]
VLM_MODEL = "tiny-qwen2.5-vl-p14"
MISMATCH = ("train/train_rollout_logprob_abs_diff", "train/train_rollout_logprob_abs_diff_max", "train/train_rollout_kl")


def train_flags(a: argparse.Namespace, out: Path) -> list[str]:
    """The GRPO workload: the maxdigit task, 8 prompts x 4 samples, Megatron, every sync checked. The context is
    capped at 128 tokens (the prompts are <= 34 characters): with a 32k-context model (qwen3-0.5b) the embedded
    engine's ``auto`` runner otherwise falls back to the eager ``hf`` runner, its lean KV cache too big to fit."""
    from relax.models.registry import PRESETS

    # the word-level GPU presets know only the words w0, w1, ...: maxdigit in their vocabulary
    task = "maxword" if a.model in PRESETS and PRESETS[a.model].tokenizer.startswith("wordlevel") else "maxdigit"
    return ["--device", a.device, "--train-backend", a.train_backend, "--hf-checkpoint", a.model,
            "--prompt-data", str(ROOT / f"relax/models/tasks/{task}.jsonl"), "--input-key", "prompt",
            "--label-key", "label", "--custom-rm-path", "harness.rewards.digit_share",
            "--rollout-max-response-len", "24", "--rollout-max-context-len", "128", "--lr", "1e-5", "--rollout-batch-size", "8",
            "--n-samples-per-prompt", "4", "--global-batch-size", "32", "--micro-batch-size", "16",
            "--num-rollout", str(a.steps), "--check-weight-update-equal", "--output-dir", str(out),
            "--overwrite-output-dir"]


def vlm_flags(a: argparse.Namespace, out: Path) -> list[str]:
    """Issue 44's run: the vlm-quickstart preset (torch trainer, colocate, the colorshape picture task) for ``--steps``
    steps of 16-token answers, every sync checked."""
    return ["--preset", "vlm-quickstart", "--hf-checkpoint", a.model, "--device", a.device,
            "--num-rollout", str(a.steps), "--rollout-max-response-len", "16", "--check-weight-update-equal",
            *([] if a.fp32 else ["--bf16"]), "--output-dir", str(out), "--overwrite-output-dir"]


def run_train(flags: list[str], log: Path, timeout_s: float, env: dict[str, str] | None = None) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "relax.cli", "train", *flags]
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "RELAX_SGLANG_PYTHONPATH": SITE, **(env or {})})
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=30)
            rc = 124
    tail = log.read_text().splitlines()[-6:]
    return {"command": " ".join(["relax", "train", *flags]), "rc": rc, "wall_s": round(time.monotonic() - start, 1),
            "log_tail": tail}


def judge_weights(run_dir: Path) -> dict[str, Any]:
    from harness.artifacts import RunArtifacts
    from harness.checks import CheckContext, parse_check

    ctx = CheckContext(runs={"main": RunArtifacts.load(run_dir)}, root=run_dir, baselines_dir=run_dir / "baselines",
                       baseline_key="none")
    res = parse_check({"kind": "weight_equality", "min_versions": 2}).run_check(ctx)
    layouts = sorted({r.get("layout", "relax") for r in RunArtifacts.load(run_dir).weights if r.get("side") != "trainer"})
    return {"status": res.status.value, "message": res.message, "layouts": layouts}


def summarise(run_dir: Path) -> dict[str, Any]:
    """What the docs quote of one run, from its artifacts."""
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    events = read_jsonl(run_dir / "events.jsonl")
    synced = [e for e in events if e.get("event") == "weights_synced"]
    rewards = [m["rollout/reward_mean"] for m in metrics if "rollout/reward_mean" in m]
    out: dict[str, Any] = {
        "steps": len(metrics), "syncs": len(synced),
        "transports": sorted({t for e in synced for t in e.get("transports", [])}),
        "reward_first_last": [rewards[0], rewards[-1]] if rewards else None,
        "reward_mean_last3": statistics.mean(rewards[-3:]) if rewards else None,
        "weights": judge_weights(run_dir),
    }
    for key in (*MISMATCH, "rollout/response_len_mean"):
        values = [float(m[key]) for m in metrics if key in m]
        out[key] = {"mean": statistics.mean(values), "max": max(values)} if values else None
    try:
        out["phases"] = step_phases(metrics, warmup=2)
    except ValueError as exc:
        out["phases"] = str(exc)
    return out


def colocate(a: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for engine in a.engines:
        out = a.workdir / f"colocate_{a.model}_{engine}"
        flags = train_flags(a, out) + ["--colocate"]
        if engine == "sglang":
            flags += ["--rollout-backend", "sglang", *SGLANG_FLAGS]
        row = {"run": "colocate", "engine": engine, "model": a.model,
               **run_train(flags, a.workdir / f"colocate_{a.model}_{engine}.log", a.timeout)}
        rows.append(_finish(row, out))
    return rows


def colocate_tp2(a: argparse.Namespace) -> list[dict[str, Any]]:
    """Two GPUs, both shared: the Megatron trainer at TP 2 and one SGLang engine of two GPUs (``--tp-size 2``)."""
    out = a.workdir / f"colocate_tp2_{a.model}_sglang"
    flags = train_flags(a, out) + ["--colocate", "--resource", '{"actor": [1, 2], "rollout": [1, 2]}',
                                   "--rollout-num-gpus-per-engine", "2", "--tensor-model-parallel-size", "2",
                                   "--rollout-backend", "sglang", *SGLANG_FLAGS]
    row = {"run": "colocate, an engine of 2 GPUs", "engine": "sglang", "model": a.model,
           **run_train(flags, a.workdir / f"colocate_tp2_{a.model}.log", a.timeout)}
    return [_finish(row, out)]


def fully_async(a: argparse.Namespace) -> list[dict[str, Any]]:
    out = a.workdir / f"async_{a.model}_sglang"
    flags = train_flags(a, out) + ["--fully-async", "--max-staleness", "1",
                                                   "--rollout-backend", "sglang", *SGLANG_FLAGS]
    row = {"run": "fully-async, separate GPUs", "engine": "sglang", "model": a.model,
           **run_train(flags, a.workdir / f"async_{a.model}.log", a.timeout)}
    return [_finish(row, out)]


def vlm(a: argparse.Namespace) -> list[dict[str, Any]]:
    """The VLM preset with real SGLang, then with the embedded engine (``--engines``, in that order), on one GPU."""
    rows = []
    for engine in a.engines:
        out = a.workdir / f"vlm_{a.model}_{engine}"
        flags = vlm_flags(a, out)
        if engine == "sglang":
            flags += ["--rollout-backend", "sglang", *SGLANG_FLAGS, *VLM_SGLANG_FLAGS]
        timeout = a.timeout if engine == "sglang" else a.embedded_timeout or a.timeout
        row = {"run": "vlm colocate", "engine": engine, "model": a.model,
               **run_train(flags, a.workdir / f"vlm_{a.model}_{engine}.log", timeout)}
        rows.append(_finish(row, out))
    return rows


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible:
        return visible.split(",")
    import torch

    return [str(i) for i in range(torch.cuda.device_count())]


def external(a: argparse.Namespace) -> list[dict[str, Any]]:
    """An SGLang server started here on the second GPU, then ``relax train --rollout-external`` on the first."""
    import torch

    from relax.models.registry import build_model, load_tokenizer, save_hf

    gpus = _visible_gpus()
    if len(gpus) < 2:
        raise SystemExit(f"external: needs 2 visible GPUs, got {gpus}")
    model_dir = a.workdir / f"model_{a.model}"
    if not (model_dir / "config.json").is_file():
        save_hf(build_model(a.model, dtype=torch.bfloat16, seed=1234), load_tokenizer(a.model), model_dir)
    port = 31000
    log = a.workdir / "external_sglang_server.log"
    env = {**os.environ, "PYTHONPATH": f"{SITE}:{os.environ.get('PYTHONPATH', '')}", "CUDA_VISIBLE_DEVICES": gpus[1],
           "NCCL_CUMEM_ENABLE": "0"}  # as relax gives its own workers (relax.distributed.cluster.nccl_cumem_env)
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model_dir), "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "bfloat16", *SERVER_FLAGS]
    with open(log, "w") as f:
        server = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, env=env)
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server, log, a.start_timeout)
        out = a.workdir / f"external_{a.model}_sglang"
        flags = train_flags(a, out) + ["--rollout-external", "--rollout-external-engine-addrs",
                                                       f"127.0.0.1:{port}"]
        row = {"run": "external SGLang server", "engine": "sglang", "model": a.model,
               "server_command": " ".join(cmd[1:]),
               **run_train(flags, a.workdir / f"external_{a.model}.log", a.timeout,
                           env={"CUDA_VISIBLE_DEVICES": gpus[0]})}
        return [_finish(row, out)]
    finally:
        if server.poll() is None:
            os.killpg(server.pid, signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(server.pid, signal.SIGKILL)


def _wait_healthy(url: str, server: subprocess.Popen, log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"SGLang server exited with {server.returncode}: {log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{url}/health_generate", timeout=30) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise SystemExit(f"SGLang server at {url} not healthy within {timeout_s:.0f} s (log: {log})")


def _finish(row: dict[str, Any], out: Path) -> dict[str, Any]:
    if (out / "metrics.jsonl").exists():
        try:
            row.update(summarise(out))
        except (OSError, ValueError, KeyError) as exc:
            row["summary_error"] = f"{type(exc).__name__}: {exc}"
    print(json.dumps({k: v for k, v in row.items() if k not in ("log_tail", "phases")}), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run", choices=("colocate", "colocate-tp2", "async", "external", "vlm"))
    p.add_argument("--model", default=None, help=f"default: small-qwen3; {VLM_MODEL} for vlm")
    p.add_argument("--engines", nargs="+", default=["sglang", "embedded"], choices=("sglang", "embedded"))
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--device", default="cuda", help="cpu with --train-backend torch: the CPU test of this script")
    p.add_argument("--train-backend", default="megatron")
    p.add_argument("--timeout", type=float, default=400, help="seconds per relax train run")
    p.add_argument("--start-timeout", type=float, default=300, help="seconds for the external server to be healthy")
    p.add_argument("--embedded-timeout", type=float, default=None,
                   help="vlm: seconds for the embedded-engine run (default --timeout)")
    p.add_argument("--fp32", action="store_true", help="vlm: without --bf16 (the engine then serves fp32 weights)")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/sglang_runs"))
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    a.model = a.model or (VLM_MODEL if a.run == "vlm" else "small-qwen3")
    a.workdir.mkdir(parents=True, exist_ok=True)
    rows = {"colocate": colocate, "colocate-tp2": colocate_tp2, "async": fully_async, "external": external,
            "vlm": vlm}[a.run](a)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps({"rows": rows, "sglang_site": SITE, **provenance()}, indent=1) + "\n")
    if any(r["rc"] != 0 for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()
