"""``--custom-rollout-log-function-path``: the user's own logging of each step's rollout (seed 000).

The hook is slime's: ``log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool``,
called once per step after the rollout, before the step's metrics are written. ``samples`` are the step's trained
samples, ``rollout_extra_metrics`` the step's ``rollout/*`` metrics (a dict the hook may add to: what it adds is
logged with the step), ``rollout_time`` the rollout's seconds. Returning True means the hook logged the rollout
itself: the step's default ``rollout/*`` metrics are left out (the hook's own additions stay). The hook takes the
whole ``args``, as the seed fixes, so it is called from the driver.
"""

from __future__ import annotations

from argparse import Namespace
from collections.abc import Callable
from numbers import Real
from typing import Any

from relax.utils.plugins import PluginError, culprit, load_function, wrong_answer

FLAG = "--custom-rollout-log-function-path"
SIGNATURE = "log_rollout_data(rollout_id, args, samples, rollout_extra_metrics, rollout_time) -> bool"


def check_hook(path: str) -> None:
    """Load the hook before anything starts: a bad path is one line at launch, not after the first rollout."""
    load_function(path, flag=FLAG, signature=SIGNATURE, min_args=5)


def apply_hook(args: Namespace, step: int, samples: list[Any], rollout_metrics: dict[str, float],
               rollout_time: float) -> dict[str, float]:
    """The step's rollout metrics after the hook ran (itself when no hook is given)."""
    path = args.custom_rollout_log_function_path
    if not path:
        return rollout_metrics
    fn = load_function(path, flag=FLAG, signature=SIGNATURE, min_args=5)
    with culprit(FLAG, path, f"rollout {step}"):
        return merged_metrics(rollout_metrics, lambda extra: fn(step, args, samples, extra, rollout_time),
                              f"{FLAG} {path}")


def merged_metrics(defaults: dict[str, float], call: Callable[[dict[str, float]], Any], hook: str) -> dict[str, float]:
    """slime's log-hook contract, shared with the eval hook (eval_log_hook.py): ``call`` gets a copy of the default
    metrics to add to; what it adds or changes is kept, and the defaults too unless it returns True.

    ``hook`` (``flag path``) names it in errors. Its answer must be a bool (or None: it logged nothing itself), and
    what it adds numbers (a numpy or torch scalar counts, as metrics.jsonl's writer takes its ``.item()``): a metric
    that is no number would reach metrics.jsonl as text, and no plot or logger could read it."""
    extra = dict(defaults)
    skip_default = call(extra)
    if skip_default is not None and not isinstance(skip_default, bool):
        raise wrong_answer(hook, skip_default, "a bool (True: the hook logged the default metrics itself) or None",
                           got=type(skip_default).__name__)
    added = {k: v for k, v in extra.items() if k not in defaults or v != defaults[k]}
    bad = [k for k, v in added.items() if not _is_number(v)]
    if bad:
        raise PluginError(f"{hook} set metric(s) that are not numbers: " + ", ".join(f"{k}={added[k]!r:.40}" for k in bad))
    return added if skip_default is True else {**defaults, **added}


def _is_number(value: Any) -> bool:
    if isinstance(value, Real):
        return True
    try:  # a numpy or torch scalar; a tensor of several elements raises
        return callable(getattr(value, "item", None)) and isinstance(value.item(), Real)
    except (ValueError, RuntimeError):
        return False
