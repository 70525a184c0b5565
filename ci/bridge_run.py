"""Issue 39 run 5: ``--megatron-to-hf-mode bridge`` (megatron-bridge 0.6.2's AutoBridge) on one GPU.

    PYTHONPATH=/tmp/bridgesite:$PYTHONPATH python3 ci/bridge_run.py --model qwen3-0.5b --steps 3 --json OUT.json

1. ``write``: the preset (relax.models.registry, random init from a seed, bf16) saved as an HF directory with its
   tokenizer, offline (``save_pretrained``).
2. ``roundtrip``: relax's Megatron model (model.py: local spec, relax's norms and attention) built twice from that
   directory, once loaded by AutoBridge (``BridgeWeights.load``), once by relax's raw converter; every parameter
   must be equal bit for bit between the two. Then AutoBridge exports the bridge-loaded model
   (``BridgeWeights.buckets``) and every tensor of the directory must come back bit for bit (same name, dtype,
   bytes); names the export adds (a tied ``lm_head.weight``) are listed, and must equal the tensor they tie to.
3. ``train``: ``relax train --train-backend megatron --megatron-to-hf-mode bridge --hf-checkpoint DIR`` for
   ``--steps`` rollouts with ``--check-weight-update-equal``; the harness's ``weight_equality`` check judges
   weights.jsonl (ci/sglang_runs.py ``summarise``).

megatron-bridge, transformers 5.12.1 and tokenizers 0.22.2 come from /tmp/bridgesite (ci/wheelhouse/
install_bridge.sh), which must be first on this process's PYTHONPATH (relax train inherits it); relax's own
environment keeps the machine's transformers. ``--device cpu`` runs steps 1 and 2 on gloo with the CPU tests' shims
(tests/megatron_workers.py; the CPU check of this script) and, instead of relax train, ``backend_step``: relax's
Megatron backend in bridge mode and in raw mode, one optimizer step each, whose synced weights must be equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def versions() -> dict[str, str]:
    import importlib.metadata as md

    out = {}
    for dist in ("megatron-bridge", "megatron-core", "transformers", "tokenizers", "torch"):
        try:
            out[dist] = md.version(dist)
        except md.PackageNotFoundError:
            out[dist] = "absent"
    import transformers

    out["transformers_path"] = str(Path(transformers.__file__).parent)
    return out


def write_hf_dir(model: str, out: Path, seed: int) -> Path:
    from relax.models.registry import build_model, load_tokenizer, save_hf

    if (out / "config.json").exists():
        return out
    hf = build_model(model, dtype=torch.bfloat16, seed=seed)
    return save_hf(hf, load_tokenizer(model), out)


def _params(built) -> dict[str, torch.Tensor]:
    return {n: p.detach() for n, p in built.gpt.named_parameters()}


def roundtrip(hf_dir: Path, device: str, seed: int) -> dict[str, Any]:
    """Bridge load vs raw load of relax's model, then bridge export vs the directory's tensors (bitwise)."""
    from transformers import AutoConfig

    from relax.backends.megatron.bridge import BridgeWeights
    from relax.backends.megatron.config import McoreModelSpec
    from relax.backends.megatron.hf_source import SafetensorsReader
    from relax.backends.megatron.model import build_gpt_model
    from relax.backends.megatron.parallel import ParallelSizes, init_parallel_state, rank_pos
    from relax.backends.megatron.weights import ShardPlan, load_hf_weights
    from relax.weights.hf_files import read_hf_dir

    if device == "cpu":  # megatron-core hard-codes CUDA in places: the CPU tests' shims redirect them
        from tests.megatron_workers import install_cpu_shims

        install_cpu_shims()
    sizes = ParallelSizes()
    init_parallel_state(sizes, seed, backend="nccl" if device == "cuda" else "gloo")
    spec = McoreModelSpec.from_hf(AutoConfig.from_pretrained(hf_dir, local_files_only=True))
    t0 = time.monotonic()
    bridge = BridgeWeights(str(hf_dir))
    by_bridge = build_gpt_model(spec, sizes=sizes, device=device)
    bridge.load(by_bridge)
    load_s = time.monotonic() - t0
    by_raw = build_gpt_model(spec, sizes=sizes, device=device)
    load_hf_weights(by_raw, ShardPlan.of(by_raw, sizes.layout, rank_pos()), SafetensorsReader(str(hf_dir)))
    a, b = _params(by_bridge), _params(by_raw)
    load_unequal = sorted(n for n in a if n not in b or not torch.equal(a[n], b[n]))
    del by_raw, b
    t0 = time.monotonic()
    exported = {n: t.cpu() for bucket in bridge.buckets(by_bridge, 1 << 28) for n, t in bucket}
    export_s = time.monotonic() - t0
    source = dict(read_hf_dir(hf_dir))
    unequal = sorted(n for n, t in source.items()
                     if n not in exported or exported[n].dtype != t.dtype or not torch.equal(exported[n], t))
    extra = sorted(set(exported) - set(source))
    tied = source.get("model.embed_tokens.weight")
    extra_unequal = [n for n in extra if not (n == "lm_head.weight" and tied is not None
                                              and torch.equal(exported[n], tied))]
    n_params = len(a)
    del by_bridge, bridge, a
    if device == "cuda":  # relax train runs next on this GPU
        torch.cuda.empty_cache()
    return {
        "hf_tensors": len(source), "exported_tensors": len(exported), "megatron_params": n_params,
        "params_unequal_bridge_vs_raw": load_unequal, "export_unequal": unequal, "export_extra": extra,
        "export_extra_unequal": extra_unequal, "load_s": round(load_s, 2), "export_s": round(export_s, 2),
        "bitwise": not load_unequal and not unequal and not extra_unequal,
    }


def backend_step(hf_dir: Path) -> dict[str, Any]:
    """CPU only (the shims): relax's `MegatronTrainBackend` parsed with ``--megatron-to-hf-mode bridge`` and with
    raw, one optimizer step each on the same samples; the synced weights (``weight_buckets``) must be equal bit for
    bit and must have moved. What relax train's every sync exports, without the engine."""
    from relax.backends.config import TrainerConfig
    from relax.backends.megatron import checks
    from relax.backends.megatron.backend import MegatronTrainBackend
    from relax.backends.torch.batch import build_rollout_tensors
    from relax.utils.arguments import parse_args
    from tests.gpu.samples import varied_samples

    checks._cuda_available = lambda: True  # parse as on the GPU machine (bridge_problem runs here)
    states = {}
    for mode in ("bridge", "raw"):
        args = parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", str(hf_dir),
                           "--megatron-to-hf-mode", mode, "--prompt-data", "x.jsonl", "--rollout-batch-size", "2",
                           "--n-samples-per-prompt", "4", "--num-rollout", "1", "--micro-batch-size", "2", "--lr",
                           "3e-3", "--no-bias-swiglu-fusion", "--no-bias-dropout-fusion", "--no-rope-fusion"])
        backend = MegatronTrainBackend(TrainerConfig.from_args(args), "cpu")
        before = {k: v.clone() for k, v in backend.hf_state().items()}
        batch = build_rollout_tensors(varied_samples(0))
        old = backend._log_probs_no_grad(backend.model, batch)
        adv = torch.tensor([1.0 if s.reward else -1.0 for s in batch.samples]).unsqueeze(1) * batch.loss_mask
        backend._optimizer_step(batch, slice(0, 8), old - 0.1, None, adv)
        after = {k: v.clone() for k, v in backend.hf_state().items()}
        states[mode] = (before, after)
        del backend
    (b0, b1), (r0, r1) = states["bridge"], states["raw"]
    return {"tensors": len(b1), "same_names": sorted(b1) == sorted(r1), "only_bridge": sorted(set(b1) - set(r1)),
            "only_raw": sorted(set(r1) - set(b1)),
            "unequal_before_step": sorted(k for k in b0 if k not in r0 or not torch.equal(b0[k], r0[k])),
            "unequal_after_step": sorted(k for k in b1 if k not in r1 or not torch.equal(b1[k], r1[k])),
            "moved": sum(not torch.equal(b0[k], b1[k]) for k in b0)}


def train(a: argparse.Namespace, hf_dir: Path) -> dict[str, Any]:
    from ci.sglang_runs import run_train, summarise

    out = a.workdir / "train"
    flags = ["--device", "cuda", "--train-backend", "megatron", "--megatron-to-hf-mode", "bridge",
             "--hf-checkpoint", str(hf_dir), "--prompt-data", str(ROOT / "relax/models/tasks/maxword.jsonl"),
             "--input-key", "prompt", "--label-key", "label", "--custom-rm-path", "harness.rewards.digit_share",
             "--rollout-max-response-len", "24", "--lr", "1e-5", "--rollout-batch-size", "8",
             "--n-samples-per-prompt", "4", "--global-batch-size", "32", "--micro-batch-size", "16",
             "--num-rollout", str(a.steps), "--check-weight-update-equal", "--colocate", "--output-dir", str(out),
             "--overwrite-output-dir", *a.train_args]
    row = run_train(flags, a.workdir / "relax_train.log", a.timeout)
    if (out / "metrics.jsonl").exists():
        try:
            row.update(summarise(out))
        except (OSError, ValueError, KeyError) as exc:
            row["summary_error"] = f"{type(exc).__name__}: {exc}"
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="qwen3-0.5b", help="a relax.models.registry preset")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--timeout", type=float, default=400, help="seconds for relax train")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/bridge_run"))
    p.add_argument("--train-args", nargs=argparse.REMAINDER, default=[], help="more relax train flags (last)")
    p.add_argument("--json", type=Path)
    a = p.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {"model": a.model, "versions": versions(), "pythonpath": os.environ.get("PYTHONPATH")}
    hf_dir = write_hf_dir(a.model, a.workdir / a.model, a.seed)
    result["hf_dir"] = str(hf_dir)
    try:
        result["roundtrip"] = roundtrip(hf_dir, a.device, a.seed)
    except Exception as exc:  # noqa: BLE001 - the JSON says what failed; relax train still runs
        result["roundtrip"] = {"error": f"{type(exc).__name__}: {exc}"[:2000], "bitwise": False}
    print(json.dumps({"roundtrip": result["roundtrip"]}), flush=True)
    if a.device == "cpu":
        step = result["backend_step"] = backend_step(hf_dir)
        print(json.dumps({"backend_step": step}), flush=True)
        result["roundtrip"]["bitwise"] &= step["same_names"] and not step["unequal_after_step"] and step["moved"] > 0
    if a.device == "cuda":
        result["train"] = train(a, hf_dir)
        print(json.dumps({k: v for k, v in result["train"].items() if k != "phases"}), flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(result, indent=1) + "\n")
    ok = result["roundtrip"].get("bitwise") and result.get("train", {"rc": 0})["rc"] == 0
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
