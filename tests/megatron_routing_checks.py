"""Routing replay checks on a built `MegatronTrainBackend`, shared by the gloo CPU tests
(tests/test_megatron_routing_replay_cpu.py, in spawned workers) and the GPU test
(tests/gpu/test_megatron_routing_replay_gpu.py, in process).

What the routers used is observed, not assumed: a forward hook on each of the policy's megatron-core routers
reads the ``routing_map`` it hands the token dispatcher (``[s * b, experts]``, seq-first), and a wrapper around
the stage forward (schedule.gpt_forward) tells which micro-batch it was; each row's experts are keyed by its
tokens. Every rank checks its own forwards; counts are summed over the ranks.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import torch
import torch.distributed as dist

from relax.backends.torch.batch import TrainSample
from relax.models import moe_routing
from tests.gpu.samples import varied_samples

ROLLOUT_LP = -1.0  # every sample's rollout log-probs: the train/rollout mismatch metrics need some


def megatron_flags(model: str, world: int, *extra: str) -> list[str]:
    """A policy of ``model`` on ``world`` ranks: 8 samples a rollout, two PPO epochs (`--num-iters-per-train-update`)."""
    return ["--train-backend", "megatron", "--device", "cuda", "--hf-checkpoint", model, "--prompt-data", "x.jsonl",
            "--rollout-batch-size", "2", "--n-samples-per-prompt", "4", "--num-rollout", "1", "--micro-batch-size", "2",
            "--lr", "3e-3", "--num-iters-per-train-update", "2", "--resource", f'{{"actor": [{world}, {world}]}}',
            *extra]


def _sum(value: int) -> int:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64)
    if dist.get_backend() == "nccl":
        t = t.cuda()
    dist.all_reduce(t)
    return int(t.item())


def _gather(obj) -> list:
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return [obj]
    out: list = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _model_parallel(backend) -> int:
    """How many ranks run each micro-batch (TP x PP): each observes every row it runs."""
    world = dist.get_world_size() if dist.is_initialized() else 1
    return world // backend.dp.size


def _routers(backend) -> list[tuple[int, torch.nn.Module]]:
    return [(layer.layer_number - 1, layer.mlp.router) for layer in backend.built.gpt.decoder.layers
            if getattr(layer.mlp, "router", None) is not None]


@contextmanager
def observed(backend) -> Iterator[list[tuple[str, dict[tuple[int, ...], dict[int, np.ndarray]]]]]:
    """Per policy forward on this rank: ``(phase, {row tokens: {global layer: [len(tokens) - 1, top_k] experts,
    sorted}})``; ``phase`` is whatever ``backend.phase`` says when the forward runs."""
    from relax.backends.megatron import schedule

    seen: list = []
    current: dict = {}
    top_k = backend.hf_config.num_experts_per_tok

    def hook_for(layer: int):
        def hook(router, inputs, output):
            current["maps"][layer] = output[1].detach().to("cpu")
        return hook

    forward = schedule.gpt_forward

    def watching(model, inputs, **kw):
        current["maps"] = {}
        out = forward(model, inputs, **kw)
        if current["maps"]:  # the policy (only its routers are hooked)
            b = inputs.input_ids.shape[0]
            rows: dict = {}
            for i, n in enumerate(inputs.attention_mask.sum(-1).tolist()):
                per_layer = {}
                for layer, routing_map in current["maps"].items():
                    grid = routing_map.view(-1, b, routing_map.shape[-1]).transpose(0, 1)  # [b, s, experts]
                    picked = grid[i, :n - 1].float().topk(top_k, dim=-1).indices.sort(-1).values
                    assert (grid[i, :n - 1].sum(-1) == top_k).all()  # exactly top_k experts per token
                    per_layer[layer] = picked.numpy()
                rows[tuple(inputs.input_ids[i, :n].tolist())] = per_layer
            seen.append((getattr(backend, "phase", ""), rows))
        return out

    handles = [router.register_forward_hook(hook_for(layer)) for layer, router in _routers(backend)]
    schedule.gpt_forward = watching
    try:
        yield seen
    finally:
        schedule.gpt_forward = forward
        for h in handles:
            h.remove()


def rollout_routed_samples(backend, seed: int = 0) -> list[TrainSample]:
    """`varied_samples` carrying an engine's routing: random distinct experts per token and layer (a router of
    these weights would rarely pick them), in SGLang's base64 form."""
    layers, top_k = moe_routing.routing_shape(backend.hf_config)
    experts = backend.hf_config.num_experts
    g = torch.Generator().manual_seed(seed)
    samples = varied_samples(seed)
    for s in samples:
        rows = torch.rand(len(s.tokens) - 1, layers, experts, generator=g).argsort(-1)[..., :top_k]
        s.routed_experts = moe_routing.encode(rows.numpy().astype(np.int32))
        s.rollout_log_probs = [ROLLOUT_LP] * s.response_length
    return samples


def check_rollout_routing_replayed(backend) -> dict:
    """R3: every policy forward (the old pass and both epochs of updates) routes every token to the rollout's experts."""
    samples = rollout_routed_samples(backend)
    want = {tuple(s.tokens): moe_routing.decode(s.routed_experts, *moe_routing.routing_shape(backend.hf_config))
            for s in samples}
    with observed(backend) as seen:
        metrics = backend.train_rollout(samples, 0)
    rows = 0
    for _, forward in seen:
        for tokens, per_layer in forward.items():
            for layer, got in per_layer.items():
                assert (got == np.sort(want[tokens][:, layer], -1)).all(), f"layer {layer} routed off the rollout"
            rows += 1
    assert _sum(rows) == 3 * len(samples) * _model_parallel(backend)  # the old pass and two epochs, every rank
    assert metrics["train/routing_replay_tokens"] == 3 * sum(len(s.tokens) - 1 for s in samples)
    assert metrics["train/routing_replay_changed_frac"] > 0.3  # random experts: the routers' own differ mostly
    assert "train/train_rollout_logprob_abs_diff" in metrics
    return metrics


def drift_after_old_pass(backend, seed: int = 1) -> None:
    """After the old-log-prob pass the policy's routers move (the same on every rank): a stand-in for earlier
    updates' drift, so that the update's own routing differs from the old pass's. The optimizer's first step
    puts its fp32 copy back; the later steps move the routers themselves."""
    columns = backend._rollout_columns

    def then_drift(*args, **kwargs):
        out = columns(*args, **kwargs)
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, router in _routers(backend):
                scale = router.weight.float().abs().mean().item()  # a CPU generator: the same noise on CPU and GPU ranks
                noise = torch.randn(router.weight.shape, generator=g) * scale
                router.weight.add_(noise.to(router.weight.device, router.weight.dtype))
        backend.phase = "update"
        return out

    backend.phase = "old"
    backend._rollout_columns = then_drift


def check_update_follows_old_pass(backend, *, replayed: bool) -> dict:
    """``replayed`` (--use-routing-replay): every update forward routes each row as the old pass did, though the
    routers moved; without the flag, the same drift makes some update forward route otherwise."""
    drift_after_old_pass(backend)
    samples = varied_samples(0)
    for s in samples:
        s.rollout_log_probs = [ROLLOUT_LP] * s.response_length
    with observed(backend) as seen:
        metrics = backend.train_rollout(samples, 0)
    old: dict = {}
    for mine in _gather([rows for phase, rows in seen if phase == "old"]):  # rows by rank, layers by stage
        for rows in mine:
            for tokens, per_layer in rows.items():
                old.setdefault(tokens, {}).update(per_layer)
    assert len(old) == len(samples)
    differ = updates = 0
    for phase, forward in seen:
        if phase != "update":
            continue
        for tokens, per_layer in forward.items():
            updates += 1
            differ += any(not (got == old[tokens][layer]).all() for layer, got in per_layer.items())
    assert _sum(updates) == 2 * len(samples) * _model_parallel(backend)  # two epochs of (two) optimizer steps
    differ = _sum(differ)
    assert metrics["train/num_optimizer_steps"] == 4.0
    assert "train/train_rollout_logprob_abs_diff" in metrics
    if replayed:
        assert differ == 0, f"{differ} update rows routed otherwise than the old pass"
        assert metrics["train/routing_replay_tokens"] == 2 * sum(len(s.tokens) - 1 for s in samples)
        assert metrics["train/routing_replay_changed_frac"] > 0  # the drifted routers alone would route otherwise
    else:
        assert differ > 0, "the drift changed no routing: this check could not fail"
        assert "train/routing_replay_tokens" not in metrics
    return {"differ": differ, "metrics": metrics}


FULL_RECOMPUTE = ("--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")


def check_full_recompute_replays_in_the_backward(make) -> dict:
    """``--recompute-granularity full`` with rollout routing replay: the layers' forward runs again in the backward,
    and its routers route as the replayed forward did (megatron-core's REPLAY_BACKWARD), so the update equals the
    one without recompute bitwise. Routed freely there (the rollout's random experts are rarely the routers' own),
    the gradients, and so the weights, would differ. ``make(*flags)`` builds a backend."""
    plain = make("--use-rollout-routing-replay")
    full = make("--use-rollout-routing-replay", *FULL_RECOMPUTE)
    assert full.cfg.megatron.recompute_granularity == "full"
    metrics = [b.train_rollout(rollout_routed_samples(b), 0) for b in (plain, full)]
    want, got = ({k: v for k, v in m.items() if not k.startswith("perf/")} for m in metrics)
    assert want == got, {k: (want.get(k), got.get(k)) for k in want.keys() | got.keys() if want.get(k) != got.get(k)}
    for (name, a), b in zip(plain.built.gpt.named_parameters(), full.built.gpt.parameters(), strict=True):
        assert torch.equal(a, b), f"{name} differs after the step with full recompute"
    return metrics[1]
