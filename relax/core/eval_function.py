"""``--eval-function-path``: the evaluation's own generation function (seed 000; slime's ``eval_function_path``).

Its signature is the rollout function's, ``generate_rollout(args, rollout_id, data_source, evaluation=True)``,
called by the driver at each eval step (``--eval-interval``) in place of the built-in evaluation
(relax/engine/rollout/evaluation.py). Unset, it is ``--rollout-function-path``; while that names the built-in
``relax.engine.rollout.sglang_rollout.generate_rollout`` the built-in evaluation runs (over ``--eval-prompt-data``).

What it returns is ``{eval set name: {"rewards": [float], "samples": [Sample], ...}}`` (slime's eval data), and
may add plain metrics as ``{name: number}``. Each set gives ``eval/<name>/reward_mean`` (and ``.../samples`` is
handed on to ``--custom-eval-rollout-log-function-path``); a number is logged as ``eval/<name>`` (a name
already starting with ``eval/`` is kept).
"""

from __future__ import annotations

from numbers import Real
from typing import Any

from relax.utils.plugins import PluginError, culprit, load_function

FLAG = "--eval-function-path"
SIGNATURE = "generate_rollout(args, rollout_id, data_source, evaluation=True) -> {set name: {'rewards': [float], ...}}"
BUILTIN = "relax.engine.rollout.sglang_rollout.generate_rollout"


def custom_eval_path(eval_function_path: str | None) -> str | None:
    """The path to call at eval steps, or None when the built-in evaluation runs."""
    return eval_function_path if eval_function_path and eval_function_path != BUILTIN else None


def load_eval_function(path: str):
    return load_function(path, flag=FLAG, signature=SIGNATURE, min_args=3)


def eval_metrics(result: Any, path: str) -> tuple[dict[str, float], dict[str, dict[str, list]]]:
    """The ``eval/*`` metrics and the per-set data of what the eval function returned."""
    if not isinstance(result, dict):
        raise PluginError(f"{FLAG}: {path!r} returned {type(result).__name__}; expected {SIGNATURE}")
    metrics: dict[str, float] = {}
    data: dict[str, dict[str, list]] = {}
    for name, value in result.items():
        if isinstance(value, Real) and not isinstance(value, bool):
            metrics[name if str(name).startswith("eval/") else f"eval/{name}"] = float(value)
        elif isinstance(value, dict) and isinstance(value.get("rewards"), list | tuple):
            rewards = [float(r) for r in value["rewards"]]
            data[name] = {"samples": list(value.get("samples") or []), "rewards": rewards}
            if rewards:
                metrics[f"eval/{name}/reward_mean"] = sum(rewards) / len(rewards)
        else:
            raise PluginError(f"{FLAG}: {path!r} returned {name!r}: {type(value).__name__}; expected a number or "
                              f"{{'rewards': [float], 'samples': [Sample]}}")
    return metrics, data


def run_eval_function(fn, path: str, args, step: int, data_source: Any) -> tuple[dict[str, float], dict[str, dict[str, list]]]:
    with culprit(FLAG, path, f"eval at rollout {step}"):
        result = fn(args, step, data_source, evaluation=True)
    return eval_metrics(result, path)
