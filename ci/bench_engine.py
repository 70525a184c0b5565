"""Embedded engine vs HF ``generate`` on bench-270m, and the bf16 train/rollout log-prob mismatch.

    python ci/bench_engine.py [--batch 64] [--prompt 128] [--new 256] [--runners hf ... lean+graph+compile]

GPU only. Workload from MACHINES.md: random-init bench-270m (Qwen3, 267M params, bf16), 64
random 128-token prompts, 256 sampled tokens each (temperature 1), EOS disabled so every row
decodes the full length. Prints one table: tokens/s of HF generate and of each engine runner,
measured side by side in this run, the ratio to HF, and the share of the HBM roofline (weights
plus the average KV cache read once per decode step at --hbm-tbps). Then, per runner, the
mean/max |engine log-prob - trainer log-prob| with both sides in bf16 on the same weights.
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from relax.backends.embedded.engine import EmbeddedEngine
from relax.backends.torch.batch import TrainSample, build_model_inputs, build_rollout_tensors
from relax.backends.torch.logprobs import response_log_probs
from relax.models import build_config, build_model

RUNNERS = {"hf": dict(runner="hf"), "static": dict(runner="static"), "static+graph": dict(runner="static", cuda_graph=True),
           "lean": dict(runner="lean"), "lean+graph": dict(runner="lean", cuda_graph=True),
           "lean+graph+compile": dict(runner="lean", cuda_graph=True, compile=True)}


def timed(fn) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def hf_generate(model, prompts: torch.Tensor, new: int) -> float:
    def run() -> None:
        model.generate(prompts, attention_mask=torch.ones_like(prompts), do_sample=True, temperature=1.0, top_k=0,
                       max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)

    run()  # warm-up
    return timed(run)


def engine_requests(prompts: torch.Tensor, new: int, seed0: int) -> list[dict]:
    return [{"input_ids": p.tolist(), "return_logprob": True,
             "sampling_params": {"temperature": 1.0, "max_new_tokens": new, "sampling_seed": seed0 + i}}
            for i, p in enumerate(prompts)]


def mismatch(model, requests: list[dict], responses: list[dict]) -> tuple[float, float]:
    samples = [TrainSample(tokens=r["input_ids"] + o["output_ids"], response_length=len(o["output_ids"]),
                           loss_mask=[1] * len(o["output_ids"]), reward=0.0,
                           rollout_log_probs=[x[0] for x in o["meta_info"]["output_token_logprobs"]])
               for r, o in zip(requests, responses, strict=True)]
    batch = build_rollout_tensors(samples)
    diffs = []
    for i in range(0, len(samples), 16):
        inputs = build_model_inputs(samples[i : i + 16], batch.loss_mask.shape[1], 0, "cuda")
        with torch.no_grad():
            lp, _ = response_log_probs(model, inputs, temperature=1.0, with_entropy=False)
        mask = batch.loss_mask[i : i + 16].cuda()
        diffs.append(((lp - batch.rollout_log_probs[i : i + 16].cuda()).abs() * mask)[mask > 0])
    d = torch.cat(diffs)
    return float(d.mean()), float(d.max())


def release_resume(engine: EmbeddedEngine) -> tuple[float, float, float, float]:
    """GiB held, GiB freed by /release_memory_occupation, seconds to release and to resume."""
    held = torch.cuda.memory_allocated() / 2**30
    t_rel = timed(engine.release_memory_occupation)
    freed = held - torch.cuda.memory_allocated() / 2**30
    t_res = timed(engine.resume_memory_occupation)
    return held, freed, t_rel, t_res


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=128)
    ap.add_argument("--new", type=int, default=256)
    ap.add_argument("--hbm-tbps", type=float, default=3.0)
    ap.add_argument("--runners", nargs="+", default=list(RUNNERS))
    ns = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench_engine: needs a CUDA GPU", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    model = build_model("bench-270m", dtype=torch.bfloat16, seed=0).cuda().eval()
    cfg = build_config("bench-270m")
    prompts = torch.randint(3, cfg.vocab_size, (ns.batch, ns.prompt), device="cuda")
    tokens = ns.batch * ns.new
    results = {"HF generate": tokens / hf_generate(model, prompts, ns.new)}
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    kv_per_token = 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * cfg.head_dim * 2
    avg_ctx = ns.prompt + ns.new / 2
    step_bytes = weight_bytes + ns.batch * avg_ctx * kv_per_token
    roofline = ns.batch / (step_bytes / (ns.hbm_tbps * 1e12))
    mism, memory = {}, {}
    for name in ns.runners:
        try:
            engine = EmbeddedEngine(model, eos_token_ids=[], device="cuda", max_context_len=ns.prompt + ns.new + 8,
                                    max_running_requests=ns.batch, **RUNNERS[name])
            engine.generate(engine_requests(prompts[:4], 8, 10_000))  # warm-up / graph capture
            engine.generate(engine_requests(prompts, ns.new, 20_000))
            reqs = engine_requests(prompts, ns.new, 0)
            holder = {}
            results[f"engine {name}"] = tokens / timed(lambda e=engine, r=reqs, h=holder: h.update(out=e.generate(r)))
            mism[name] = mismatch(model, reqs, holder["out"])
            memory[name] = release_resume(engine)
        except Exception as exc:  # noqa: BLE001 - report the runner as failed, keep measuring the others
            print(f"runner {name} failed: {type(exc).__name__}: {str(exc)[:300]}")
    base = results["HF generate"]
    print(f"\nbench-270m bf16, batch {ns.batch}, prompt {ns.prompt}, {ns.new} new tokens, {torch.cuda.get_device_name()}")
    print(f"HBM roofline at {ns.hbm_tbps} TB/s: {roofline:,.0f} tok/s")
    print(f"{'engine':<22} {'tok/s':>10} {'vs HF':>8} {'% roofline':>11}")
    for name, value in results.items():
        print(f"{name:<22} {value:>10,.0f} {value / base:>7.1f}x {100 * value / roofline:>10.1f}%")
    print(f"\n{'runner':<22} {'mean |dlogp|':>13} {'max |dlogp|':>12}   (engine bf16 vs trainer bf16 full forward)")
    for name, (mean, mx) in mism.items():
        print(f"{name:<22} {mean:>13.2e} {mx:>12.2e}")
    print(f"\n{'runner':<22} {'held GiB':>9} {'freed GiB':>10} {'release s':>10} {'resume s':>9}")
    for name, (held, freed, t_rel, t_res) in memory.items():
        print(f"{name:<22} {held:>9.2f} {freed:>10.2f} {t_rel:>10.3f} {t_res:>9.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
