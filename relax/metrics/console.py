"""One console line per training step: reward, loss and where the time went."""

from __future__ import annotations

from typing import Any

from rich.console import Console

_console = Console(highlight=False, soft_wrap=True)


def _fmt(metrics: dict[str, Any], key: str, spec: str) -> str:
    value = metrics.get(key)
    return "-" if value is None else format(value, spec)


# (label, metric, format): the columns of a step line, each value after its label
COLUMNS = (
    ("reward", "rollout/reward_mean", ".3f"),
    ("resp_len", "rollout/response_len_mean", ".1f"),
    ("loss", "train/loss", "+.4f"),
    ("ppo_kl", "train/ppo_kl", ".1e"),  # KL(old policy || policy) of the update, not the reference KL
    ("kl_ref", "train/kl_loss", ".1e"),  # the --use-kl-loss estimate against the reference model
    ("gnorm", "train/grad_norm", ".3f"),
)
TIMES = (("rollout", "perf/rollout_time_s"), ("train", "perf/train_time_s"), ("sync", "perf/sync_time_s"))


def step_line(metrics: dict[str, Any], num_steps: int) -> str:
    """``step 3/100  reward 0.412  resp_len 5.0  loss +0.0123  ppo_kl 1.2e-04  ...  | rollout 0.52s ...``;
    a column whose metric the run does not log (kl_ref without a KL loss) is left out."""
    cells = [f"{label} {_fmt(metrics, key, spec)}" for label, key, spec in COLUMNS
             if key in metrics or key in ("rollout/reward_mean", "train/loss")]
    times = " ".join(f"{label} {_fmt(metrics, key, '.2f')}s" for label, key in TIMES)
    return f"step {metrics['step'] + 1:>4}/{num_steps}  " + "  ".join(cells) + f"  | {times}"


def print_step(metrics: dict[str, Any], num_steps: int) -> None:
    line = step_line(metrics, num_steps)
    head, _, rest = line.partition("  ")
    _console.print(f"[bold]{head}[/bold]  {rest}")


def info(message: str) -> None:
    _console.print(f"[cyan]relax[/cyan]: {message}")
