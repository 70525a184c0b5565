"""``--custom-eval-rollout-log-function-path``: the user's own logging of each evaluation (seed 000).

The hook is slime's: ``log_eval_rollout_data(rollout_id, args, data, extra_metrics) -> bool``, called by the
driver after each eval, before the step's metrics are written. ``data`` is ``{eval set name: {"samples":
[Sample], "rewards": [float]}}`` (the set's generated, scored samples and the rewards its metrics read),
``extra_metrics`` the eval's ``eval/*`` metrics (a dict the hook may add to: what it adds is logged with the
step). Returning True means the hook logged the eval itself: the default ``eval/*`` metrics are left out (the
hook's own additions stay). The hook takes the whole ``args``, as the seed fixes, so it is called from the
driver (as the rollout one, rollout_log_hook.py).
"""

from __future__ import annotations

from argparse import Namespace
from typing import Any

from relax.core.rollout_log_hook import merged_metrics
from relax.utils.plugins import culprit, load_function

FLAG = "--custom-eval-rollout-log-function-path"
SIGNATURE = "log_eval_rollout_data(rollout_id, args, data, extra_metrics) -> bool"


def check_hook(path: str) -> None:
    """Load the hook before anything starts: a bad path is one line at launch, not after the first eval."""
    load_function(path, flag=FLAG, signature=SIGNATURE, min_args=4)


def apply_hook(args: Namespace, step: int, data: dict[str, dict[str, list[Any]]],
               eval_metrics: dict[str, float]) -> dict[str, float]:
    """The eval's metrics after the hook ran (themselves when no hook is given)."""
    path = args.custom_eval_rollout_log_function_path
    if not path:
        return eval_metrics
    fn = load_function(path, flag=FLAG, signature=SIGNATURE, min_args=4)
    with culprit(FLAG, path, f"eval at rollout {step}"):
        return merged_metrics(eval_metrics, lambda extra: fn(step, args, data, extra), f"{FLAG} {path}")
