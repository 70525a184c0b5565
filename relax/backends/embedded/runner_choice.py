"""Which model runner the engines of ``relax train`` use (``--embedded-runner``, ``--embedded-cuda-graph``,
``--embedded-compile``): the one place ``auto`` is decided.

`resolve_runner` is the rule; `engine_runner_kwargs` applies it for `EngineActor` (with the KV-cache
sizing the preallocating runners need); `check_runner_flags` runs the same rule at parse time so a
combination that cannot work (CUDA graphs on CPU, ``--embedded-compile`` with the ``hf`` runner) fails
in milliseconds with one line. ``relax serve-engine`` keeps its own ``--runner`` / ``--cuda-graph`` /
``--compile`` flags (relax/backends/embedded/server.py) and does not use this module.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Any

from relax.backends.embedded.config import EmbeddedEngineConfig

RUNNER_CHOICES = ("auto", "hf", "static", "lean")
PREALLOCATING = ("static", "lean")  # runners that allocate slots x context length of KV cache up front
MAX_SLOTS = 256  # EmbeddedEngine's default max_running_requests
KV_BUDGET_FRACTION = 0.25  # of the device's memory (CUDA) or of physical RAM (CPU)


@dataclass(frozen=True)
class RunnerChoice:
    runner: str  # hf | static | lean
    cuda_graph: bool
    compile: bool
    why: str = ""  # set when auto fell back to hf on CUDA


def resolve_runner(requested: str, cuda_graph: bool | None, compile: bool, device: str, *,
                   kv_cache_fits: bool = True, lean_refuses: str = "") -> RunnerChoice:
    """The runner an engine on ``device`` (cpu / cuda / cuda:N) uses for these flags.

    ``requested`` ``auto``: ``lean`` with CUDA graphs on CUDA, ``hf`` on CPU. On CUDA ``auto``
    falls back to ``hf`` when the lean runner cannot run the model (``lean_refuses``: why, e.g. a MoE MLP)
    or its preallocated KV cache would not fit (``kv_cache_fits`` False: set --rollout-max-context-len),
    unless graphs or compile were asked for explicitly (then it is an error). ``cuda_graph`` None: on for ``static`` / ``lean``
    on CUDA, off otherwise. Raises ``ValueError`` (one line) for combinations that cannot work:
    CUDA graphs or compile on CPU, graphs with ``hf``, compile with anything but ``lean``.
    """
    if requested not in RUNNER_CHOICES:
        raise ValueError(f"--embedded-runner {requested!r}: choose one of {', '.join(RUNNER_CHOICES)}")
    cuda = str(device).startswith("cuda")
    if not cuda:
        if cuda_graph:
            raise ValueError("--embedded-cuda-graph needs a CUDA device (the engines run on cpu): "
                             "drop it or use --device cuda")
        if compile:
            raise ValueError("--embedded-compile needs a CUDA device (the engines run on cpu): "
                             "drop it or use --device cuda")
    runner, why = requested, ""
    if requested == "auto":
        runner = "lean" if cuda else "hf"
        if runner == "lean" and lean_refuses:
            if cuda_graph or compile:
                raise ValueError(f"--embedded-runner auto: the lean runner (CUDA graphs, compile) does not support "
                                 f"this model ({lean_refuses}); drop --embedded-cuda-graph / --embedded-compile")
            runner, why = "hf", f"the lean runner does not support this model ({lean_refuses})"
        elif runner == "lean" and not kv_cache_fits:
            if cuda_graph or compile:
                raise ValueError(_too_big("auto"))
            runner, why = "hf", "the lean runner's KV cache would not fit (set --rollout-max-context-len)"
    chosen = runner if requested == runner else f"{requested}, here {runner}"
    if runner == "hf" and cuda_graph:
        raise ValueError(f"--embedded-cuda-graph needs --embedded-runner static or lean (got {chosen}: no graphs)")
    if compile and runner != "lean":
        raise ValueError(f"--embedded-compile needs --embedded-runner lean (got {chosen})")
    if runner in PREALLOCATING and not kv_cache_fits:
        raise ValueError(_too_big(runner))
    graphs = (runner in PREALLOCATING and cuda) if cuda_graph is None else bool(cuda_graph)
    return RunnerChoice(runner, graphs, bool(compile), why)


def _too_big(runner: str) -> str:
    return (f"--embedded-runner {runner}: the engine's preallocated KV cache (slots x context length) would take "
            f"more than {KV_BUDGET_FRACTION:.0%} of the device's memory; set --rollout-max-context-len to the "
            "longest prompt plus --rollout-max-response-len, or use --embedded-runner hf")


def check_runner_flags(cfg: EmbeddedEngineConfig) -> None:
    """Parse-time check of the runner flags against ``--device`` (torch is imported only when it matters)."""
    from relax.utils.flag_types import ConfigError

    device = cfg.device
    if device == "auto" and (cfg.embedded_cuda_graph or cfg.embedded_compile):
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        resolve_runner(cfg.embedded_runner, cfg.embedded_cuda_graph, cfg.embedded_compile,
                       "cuda" if device == "auto" else device)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


def kv_cache_bytes(config: Any, slots: int, context_len: int, bytes_per_value: int) -> int:
    """K and V for every layer, ``slots`` rows of ``context_len`` positions."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * config.num_hidden_layers * kv_heads * head_dim * bytes_per_value * slots * context_len


def _memory_budget(device: str) -> int:
    import torch

    if str(device).startswith("cuda"):
        total = torch.cuda.get_device_properties(torch.device(device)).total_memory
    else:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    return int(KV_BUDGET_FRACTION * total)


def engine_runner_kwargs(cfg: EmbeddedEngineConfig, device: str, model: Any) -> dict[str, Any]:
    """``EmbeddedEngine`` keyword arguments for the runner flags (`resolve_runner`) on ``device``.

    For the preallocating runners the slot count is the samples of one rollout step (at most
    `MAX_SLOTS`; more requests queue), and the KV cache spans ``--rollout-max-context-len`` (else
    the model's ``max_position_embeddings``); `resolve_runner` decides whether that fits.
    """
    from relax.models.vision import is_vision_config

    if is_vision_config(model.config):  # only the hf runner runs a vision tower (relax/backends/embedded/vision_runner.py)
        return {"runner": "hf", "cuda_graph": False, "compile": False}
    slots = min(MAX_SLOTS, (cfg.over_sampling_batch_size or cfg.rollout_batch_size) * cfg.n_samples_per_prompt)
    limit = int(getattr(model.config, "max_position_embeddings", 0) or 1 << 30)
    context = min(cfg.rollout_max_context_len or limit, limit)
    size = kv_cache_bytes(model.config, slots, context, next(model.parameters()).element_size())
    from relax.backends.embedded.lean_runner import unsupported

    choice = resolve_runner(cfg.embedded_runner, cfg.embedded_cuda_graph, cfg.embedded_compile, device,
                            kv_cache_fits=size <= _memory_budget(device), lean_refuses=", ".join(unsupported(model)))
    if choice.why:
        print(f"relax: engine on {device}: --embedded-runner auto chose hf: {choice.why}", file=sys.stderr)
    kwargs: dict[str, Any] = {"runner": choice.runner, "cuda_graph": choice.cuda_graph, "compile": choice.compile}
    if choice.runner in PREALLOCATING:
        kwargs["max_running_requests"] = slots
    return kwargs
