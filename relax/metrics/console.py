"""One console line per training step: reward, loss and where the time went."""

from __future__ import annotations

from typing import Any

from rich.console import Console

_console = Console(highlight=False, soft_wrap=True)


def _fmt(metrics: dict[str, Any], key: str, spec: str) -> str:
    value = metrics.get(key)
    return "-" if value is None else format(value, spec)


def print_step(metrics: dict[str, Any], num_steps: int) -> None:
    step = metrics["step"]
    _console.print(
        f"[bold]step {step + 1:>4}/{num_steps}[/bold]  "
        f"reward {_fmt(metrics, 'rollout/reward_mean', '.3f')}  "
        f"loss {_fmt(metrics, 'train/loss', '+.4f')}  "
        f"kl {_fmt(metrics, 'train/ppo_kl', '.1e')}  "
        f"gnorm {_fmt(metrics, 'train/grad_norm', '.3f')}  "
        f"| rollout {_fmt(metrics, 'perf/rollout_time_s', '.2f')}s "
        f"train {_fmt(metrics, 'perf/train_time_s', '.2f')}s "
        f"sync {_fmt(metrics, 'perf/sync_time_s', '.2f')}s"
    )


def info(message: str) -> None:
    _console.print(f"[cyan]relax[/cyan]: {message}")
