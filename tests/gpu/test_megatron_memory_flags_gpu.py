"""Activation recompute and optimizer CPU offload on the Megatron backend (one GPU, bf16, small-qwen3).

Recompute: ``--recompute-granularity full`` (uniform and block) and ``selective`` give bitwise the
same old log-probs, step metrics and updated weights as no recompute: the checkpointed forward
replays the same kernels on the same inputs, the backward then runs the same kernels in the same
order (the samples are short, < 64 tokens, so the flash-attention backward has one key block and no
atomics). Peak memory of a training step on 8 x 960-token samples (activations dominate: vocab ~100)
drops: full recompute with the default sdpa attention and with megatron's unfused attention,
selective with the unfused one (sdpa keeps no s x s scores, so selective has little to drop there).
A frozen embedding keeps full recompute's gradients (the backend's embedding hook).

Offload: ``--optimizer-cpu-offload`` (with ``--use-precision-aware-optimizer
--use-distributed-optimizer``) builds megatron's HybridDeviceOptimizer with every fp32 master
weight and Adam moment on the CPU and none on the GPU. Three steps match the GPU distributed
optimizer: step 0's metrics bitwise (same weights and grads before any update), later metrics and
the fp32 master weights to within 1e-5 (the CPU fused AdamW and the CUDA foreach AdamW round
differently by ~1 fp32 ulp; a master that lands on the other side of a bf16 rounding boundary
changes that bf16 weight by one bf16 ulp, which perturbs later gradients by far less than 1e-5
of an update of lr = 3e-3; a broken offload is off by ~lr). ``--overlap-cpu-optimizer-d2h-h2d``
(one CPU optimizer per parameter, copies on side streams) is bitwise equal to the plain offload:
the fused CPU Adam kernel is elementwise. Saving the offloaded optimizer state is refused; saving
without it and loading refreshes the CPU master weights.

Skipped with a reason without CUDA or megatron-core. Run: ``pytest -s tests/gpu/test_megatron_memory_flags_gpu.py``
(measured numbers are printed, and written as JSON under ``RELAX_GPU_REPORT`` when it names a directory).
"""

from __future__ import annotations

import gc
import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from relax.backends.config import TrainerConfig
from relax.backends.megatron.checks import module_available
from tests.gpu.samples import varied_samples

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.megatron,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(not module_available("megatron.core"), reason="needs megatron-core"),
]

FULL_UNIFORM = ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]
FULL_BLOCK = ["--recompute-granularity", "full", "--recompute-method", "block", "--recompute-num-layers", "3"]
SELECTIVE = ["--recompute-granularity", "selective"]
OFFLOAD = ["--use-distributed-optimizer", "--use-precision-aware-optimizer", "--optimizer-cpu-offload"]
LR = 3e-3


def _report(name: str, data: dict) -> None:
    print(f"\n[{name}] {json.dumps(data)}")
    out = os.environ.get("RELAX_GPU_REPORT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        Path(out, f"{name}.json").write_text(json.dumps(data, indent=1))


def _args(*extra: str, micro_batch: int = 2):
    from relax.utils.arguments import parse_args

    return parse_args(["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", "small-qwen3",
                       "--prompt-data", "x.jsonl", "--rollout-batch-size", "2", "--n-samples-per-prompt", "4",
                       "--num-rollout", "1", "--micro-batch-size", str(micro_batch), "--lr", str(LR), *extra])


def _backend(*flags: str, micro_batch: int = 2):
    from relax.backends.megatron.backend import MegatronTrainBackend

    _free()
    return MegatronTrainBackend(TrainerConfig.from_args(_args(*flags, micro_batch=micro_batch)), "cuda")


def _free() -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()


def _long_samples(seed: int, prompt: int = 64, response: int = 896) -> list:
    """8 samples of 960 tokens (small-qwen3 has 1024 positions and a ~100-token vocab: activations dominate)."""
    from relax.backends.torch.batch import TrainSample

    g = torch.Generator().manual_seed(seed)
    return [TrainSample(tokens=torch.randint(3, 100, (prompt + response,), generator=g).tolist(),
                        response_length=response, loss_mask=[1] * response, reward=float(i % 2)) for i in range(8)]


@dataclass
class Run:
    old_log_probs: torch.Tensor
    metrics: list[dict[str, float]]
    state: dict[str, torch.Tensor]
    initial: dict[str, torch.Tensor]


def _hf_state(backend) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in backend.hf_state().items()}


def _train(*flags: str, steps: int = 2) -> Run:
    from relax.backends.torch.batch import build_rollout_tensors

    backend = _backend(*flags)
    _check_recompute_is_on(backend, flags)
    initial = _hf_state(backend)
    old = backend._log_probs_no_grad(backend.model, build_rollout_tensors(varied_samples(seed=0)))
    metrics = [_trained(backend.train_rollout(varied_samples(seed=step), step)) for step in range(steps)]
    run = Run(old, metrics, _hf_state(backend), initial)
    del backend
    return run


def _trained(metrics: dict) -> dict:
    """A step's training metrics without its ``perf/`` timings, which differ between any two runs."""
    return {k: v for k, v in metrics.items() if not k.startswith("perf/")}


def _flag_value(flags, name: str) -> str:
    return flags[list(flags).index(name) + 1]


def _check_recompute_is_on(backend, flags) -> None:
    """The flags reached the trainer's TransformerConfig (and the layers that read it)."""
    config, layers = backend.built.config, backend.built.gpt.decoder.layers
    if "full" in flags:
        assert config.recompute_granularity == "full"
        assert config.recompute_method == _flag_value(flags, "--recompute-method")
        assert config.recompute_num_layers == int(_flag_value(flags, "--recompute-num-layers"))
    elif "selective" in flags:
        assert config.recompute_granularity == "selective" and config.recompute_modules == ["core_attn"]
        assert all(layer.self_attention.checkpoint_core_attention for layer in layers)
    else:
        assert config.recompute_granularity is None


def _mismatch(a: Run, b: Run) -> str | None:
    if not torch.equal(a.old_log_probs, b.old_log_probs):
        return f"old log-probs differ by {(a.old_log_probs - b.old_log_probs).abs().max().item():.3g}"
    if a.metrics != b.metrics:
        return f"metrics differ: {a.metrics} vs {b.metrics}"
    for k, v in a.state.items():
        if not torch.equal(v, b.state[k]):
            return f"{k} differs by {(v.float() - b.state[k].float()).abs().max().item():.3g}"
    return None


# ---------------------------------------------------------------------- recompute
def test_recompute_is_bitwise_equal_to_no_recompute(mcore) -> None:
    base = _train()
    for flags in (FULL_UNIFORM, FULL_BLOCK, SELECTIVE):
        diff = _mismatch(_train(*flags), base)
        if diff is not None:  # say whether the baseline itself reproduces (a nondeterministic kernel)
            again = _mismatch(_train(), base)
            pytest.fail(f"{' '.join(flags)}: {diff}; a second run without recompute: {again or 'bitwise equal'}")
    assert any(not torch.equal(v, base.initial[k]) for k, v in base.state.items())  # it did train


def test_full_recompute_with_frozen_embedding_still_trains_the_layers(mcore) -> None:
    """Without the backend's embedding hook the checkpointed layers would get no gradient at all.

    The hook makes layer 0's backward also compute its input gradient, which the run without
    recompute skips; weight gradients do not depend on it, but a kernel may take another path
    when it computes both, so the weights are compared to within one bf16 ulp (rtol 2**-7)."""
    freeze = ["--freeze-params-name-list", "embedding"]
    plain, recompute = _train(*freeze), _train(*freeze, *FULL_UNIFORM)
    assert torch.equal(recompute.old_log_probs, plain.old_log_probs)
    for a, b in zip(plain.metrics, recompute.metrics, strict=True):
        assert a.keys() == b.keys() and all(math.isclose(a[k], b[k], rel_tol=1e-5, abs_tol=1e-7) for k in a), (a, b)
    for k, v in plain.state.items():
        torch.testing.assert_close(recompute.state[k].float(), v.float(), rtol=2**-7, atol=0, msg=k)
    changed = [k for k, v in recompute.state.items() if not torch.equal(v, recompute.initial[k])]
    assert any(".layers.0." in k for k in changed) and not any("embed_tokens" in k for k in changed)
    _report("recompute_frozen_embedding", {"bitwise_equal": _mismatch(recompute, plain) is None})


def _peak_step_bytes(backend) -> tuple[int, dict[str, float]]:
    """Peak allocated bytes above the steady state during one RL step (Adam state already allocated)."""
    backend.train_rollout(_long_samples(0), 0)
    _free()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    metrics = backend.train_rollout(_long_samples(1), 1)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - before, metrics


@pytest.mark.parametrize("attention", ["sdpa", "unfused"])
def test_recompute_lowers_peak_activation_memory(mcore, monkeypatch: pytest.MonkeyPatch, attention: str) -> None:
    import relax.backends.megatron.model as model_module

    monkeypatch.setattr(model_module, "DEFAULT_ATTENTION", attention, raising=False)
    variants = {"none": [], "full": FULL_UNIFORM, **({"selective": SELECTIVE} if attention == "unfused" else {})}
    peaks, losses, core = {}, {}, None
    for name, flags in variants.items():
        backend = _backend(*flags, micro_batch=8)
        core = type(backend.built.gpt.decoder.layers[0].self_attention.core_attention).__name__
        peaks[name], metrics = _peak_step_bytes(backend)
        losses[name] = metrics["train/loss"]
        del backend
    mib = {name: round(v / 2**20, 1) for name, v in peaks.items()}
    _report(f"recompute_peak_memory_{attention}", {"core_attention": core, "peak_step_mib": mib, "loss": losses})
    assert all(math.isfinite(v) for v in losses.values())
    assert peaks["full"] < 0.6 * peaks["none"], mib
    if "selective" in peaks:
        assert peaks["selective"] < 0.8 * peaks["none"], mib


# ---------------------------------------------------------------------- optimizer CPU offload
def _masters(backend) -> list[torch.Tensor]:
    """The fp32 master weights, in the distributed optimizer's parameter order, as CPU tensors."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    dopt = backend.optimizer.chained_optimizers[0]
    if isinstance(dopt.optimizer, HybridDeviceOptimizer):
        return [dopt.optimizer.param_to_fp32_param[p] for group in dopt.shard_float16_groups for p in group]
    return [m.detach().cpu() for group in dopt.shard_fp32_from_float16_groups for m in group]


def _check_offloaded(backend, *, overlap: bool) -> int:
    """Everything the optimizer keeps is on the CPU; returns the number of optimized elements."""
    from megatron.core.optimizer.cpu_offloading import HybridDeviceOptimizer

    dopt = backend.optimizer.chained_optimizers[0]
    hdo = dopt.optimizer
    assert isinstance(hdo, HybridDeviceOptimizer) and hdo.gpu_optimizer is None
    assert all(m is None for group in dopt.shard_fp32_from_float16_groups for m in group)  # no GPU fp32 masters
    shards = [p for group in dopt.shard_float16_groups for p in group]
    assert len(hdo.state) == len(shards) and len(hdo.cpu_optimizers) == (len(shards) if overlap else 1)
    for p in shards:
        state = hdo.state[p]
        assert {"exp_avg", "exp_avg_sq", "master_param"} <= set(state)
        assert all(v.device.type == "cpu" for v in state.values() if isinstance(v, torch.Tensor))
        assert state["master_param"].dtype == torch.float32 and state["exp_avg"].dtype == torch.float32
    return sum(p.numel() for p in shards)


def test_optimizer_cpu_offload_matches_the_gpu_optimizer(mcore) -> None:
    """One update from identical gradients matches the GPU optimizer to fp32 rounding; later steps are only
    reported and loosely bounded: the CPU and GPU AdamW kernels round differently by ~1 ulp, the bf16 model
    weights then round differently now and then, and Adam turns the resulting tiny gradient differences
    into sign flips of near-zero gradients (an update difference of up to 2 x lr for that element)."""
    runs, used, first = {}, {}, {}
    for name, flags in (("gpu", ["--use-distributed-optimizer"]), ("offload", OFFLOAD),
                        ("overlap", [*OFFLOAD, "--overlap-cpu-optimizer-d2h-h2d"])):
        _free()
        before = torch.cuda.memory_allocated()
        backend = _backend(*flags)
        initial = [m.clone() for m in _masters(backend)]
        metrics = [_trained(backend.train_rollout(varied_samples(seed=0), 0))]
        first[name] = [m.clone() for m in _masters(backend)]  # after one update from identical grads
        metrics += [_trained(backend.train_rollout(varied_samples(seed=step), step)) for step in (1, 2)]
        torch.cuda.synchronize()
        used[name] = torch.cuda.memory_allocated() - before
        if name != "gpu":
            numel = _check_offloaded(backend, overlap=name == "overlap")
        masters = [m.clone() for m in _masters(backend)]
        moved = max((m - i).abs().max().item() for m, i in zip(masters, initial, strict=True))
        runs[name] = (metrics, masters, _hf_state(backend), moved)
        del backend, initial
    (gpu_metrics, gpu_masters, _, gpu_moved), (off_metrics, off_masters, off_state, _) = runs["gpu"], runs["offload"]
    first_diff = max((a - b).abs().max().item() for a, b in zip(first["gpu"], first["offload"], strict=True))
    master_diff = max((a - b).abs().max().item() for a, b in zip(gpu_masters, off_masters, strict=True))
    metric_diff = max(abs(a[k] - b[k]) for a, b in zip(gpu_metrics, off_metrics, strict=True) for k in a)
    _report("optimizer_cpu_offload", {
        "gpu_memory_mib": {k: round(v / 2**20, 1) for k, v in used.items()}, "optimized_elements": numel,
        "max_master_diff_vs_gpu_after_one_step": first_diff, "max_master_diff_vs_gpu": master_diff, "max_metric_diff_vs_gpu": metric_diff, "max_master_update": gpu_moved,
        "loss": {k: [m["train/loss"] for m in r[0]] for k, r in runs.items()}})
    assert gpu_moved > LR  # three Adam steps of lr 3e-3 moved the weights
    assert gpu_metrics[0] == off_metrics[0]  # same weights, same grads: only the update differs
    assert first_diff <= 1e-6, first_diff  # fp32 masters of magnitude <~ 1: a few ulp
    for a, b in zip(gpu_metrics[1:], off_metrics[1:], strict=True):
        assert a.keys() == b.keys() and math.isclose(a["train/entropy"], b["train/entropy"], rel_tol=1e-3), (a, b)
    assert master_diff <= 3 * 2 * LR  # at most a sign flip per step per element
    # fp32 masters + two fp32 Adam moments (12 bytes per element) left the GPU
    assert used["gpu"] - used["offload"] >= 10 * numel, used
    ovl_metrics, ovl_masters, ovl_state, _ = runs["overlap"]
    assert ovl_metrics == off_metrics
    assert all(torch.equal(a, b) for a, b in zip(ovl_masters, off_masters, strict=True))
    assert all(torch.equal(v, ovl_state[k]) for k, v in off_state.items())


def test_optimizer_cpu_offload_checkpoint(mcore, tmp_path: Path) -> None:
    backend = _backend(*OFFLOAD)
    backend.train_rollout(varied_samples(seed=0), 0)
    with pytest.raises(RuntimeError, match="not supported yet"):
        backend.save(str(tmp_path / "with-optim"), save_optimizer=True)
    backend.save(str(tmp_path / "ckpt"), save_optimizer=False)
    saved = _hf_state(backend)
    del backend
    fresh = _backend(*OFFLOAD)
    fresh.load(str(tmp_path / "ckpt"))
    assert all(torch.equal(v, saved[k]) for k, v in fresh.hf_state().items())
    dopt = fresh.optimizer.chained_optimizers[0]
    shards = [p for group in dopt.shard_float16_groups for p in group]
    # reload_model_params refreshed the CPU fp32 masters from the loaded bf16 weights
    assert all(torch.equal(m, p.detach().float().cpu()) for m, p in zip(_masters(fresh), shards, strict=True))
    metrics = fresh.train_rollout(varied_samples(seed=1), 1)
    assert math.isfinite(metrics["train/loss"]) and math.isfinite(metrics["train/grad_norm"])


def _grad_buffer_bytes(backend) -> int:
    return sum(b.grad_data.nbytes for b in backend.model.buffers + backend.model.expert_parallel_buffers)


@pytest.mark.parametrize("flags", [(), ("--use-distributed-optimizer",)], ids=["optimizer", "distributed-optimizer"])
def test_offload_train_frees_grads_and_optimizer_state_and_trains_bitwise(mcore, flags: tuple[str, ...]) -> None:
    """--offload-train (relax/backends/megatron/offload.py): after each step the fp32 gradient buffers and the
    optimizer's fp32 masters and Adam moments leave the GPU (at least their bytes are freed), the bf16 weights
    stay readable for the sync, and two steps with round trips equal two steps without them, bit for bit."""
    from relax.backends.megatron.offload import _optimizer_tensors

    plain = _train(*flags, steps=2)
    backend = _backend(*flags)
    grads = _grad_buffer_bytes(backend)
    parked = backend.offload()  # before the first rollout, as the colocate loop does: no Adam state yet
    assert parked["device_bytes"] >= grads, (parked, grads)
    metrics, freed = [], []
    for step in range(2):
        backend.onload()
        assert all(t.is_cuda for t in _optimizer_tensors(backend.optimizer))
        metrics.append(_trained(backend.train_rollout(varied_samples(seed=step), step)))
        optimizer_bytes = sum(t.nbytes for t in _optimizer_tensors(backend.optimizer))
        out = backend.offload()
        assert not any(t.is_cuda for t in _optimizer_tensors(backend.optimizer))
        assert out["moved_bytes"] == optimizer_bytes and out["device_bytes"] >= grads + optimizer_bytes, out
        freed.append(out["device_bytes"])
    assert metrics == plain.metrics
    state = _hf_state(backend)  # read while offloaded: what the weight sync does next
    assert all(torch.equal(v, plain.state[k]) for k, v in state.items())
    with pytest.raises(RuntimeError, match="offloaded already"):
        backend.offload()
    backend.onload()
    with pytest.raises(RuntimeError, match="not offloaded"):
        backend.onload()
    _report(f"megatron_offload_train_{'dist' if flags else 'plain'}",
            {"grad_buffer_bytes": grads, "freed_bytes_per_step": freed, "optimizer_bytes": optimizer_bytes})


def test_relax_train_megatron_colocate_with_offload_train(tmp_path: Path) -> None:
    """The colocate loop with the Megatron trainer offloaded during every rollout: each move is recorded with
    the bytes it freed, and the engine holds the trainer's weights at every version."""
    from harness.artifacts import RunArtifacts
    from harness.checks import CheckContext, Status, parse_check
    from tests.e2e_helpers import FAST_FLAGS, assert_ok, read_jsonl, run_relax

    run = tmp_path / "run"
    assert_ok(run_relax([*FAST_FLAGS, "--device", "cuda", "--train-backend", "megatron", "--hf-checkpoint",
                         "small-qwen3", "--colocate", "--offload-train", "--num-rollout", "3",
                         "--output-dir", str(run)], tmp_path))
    moves = [e for e in read_jsonl(run / "events.jsonl") if e["event"] in ("trainer_offload", "trainer_onload")]
    assert [e["event"] for e in moves] == ["trainer_offload"] + ["trainer_onload", "trainer_offload"] * 3
    assert all(e["device_bytes"] > 0 for e in moves), moves
    context = CheckContext(runs={"main": RunArtifacts.load(run)}, root=run)
    result = parse_check({"kind": "weight_equality"}).run_check(context)
    assert result.status is Status.PASSED, result.message
    _report("megatron_colocate_offload_train", {"moves": [{k: e[k] for k in ("event", "step", "seconds", "device_bytes")}
                                                          for e in moves]})
