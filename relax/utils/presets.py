"""Named bundles of defaults for ``--preset`` (values keyed by flag dest names).

Precedence when parsing: documented defaults < preset < --config / --custom-config-path files
< explicit command-line flags.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _task_data(name: str) -> str:
    return str(Path(__file__).resolve().parents[1] / "models" / "tasks" / f"{name}.jsonl")


def _quickstart() -> dict[str, Any]:
    """CPU GRPO on the `addmod` task with the 80k-param tiny-qwen3: learns in a few minutes on 2 cores."""
    return {
        "train_backend": "torch",
        "device": "cpu",
        "colocate": True,
        "hf_checkpoint": "tiny-qwen3",
        "prompt_data": _task_data("addmod"),
        "input_key": "prompt",
        "label_key": "label",
        "rm_type": "exact",
        "rollout_shuffle": True,
        "rollout_batch_size": 32,
        "n_samples_per_prompt": 8,
        "rollout_max_response_len": 1,
        "rollout_temperature": 1.0,
        "micro_batch_size": 64,  # --global-batch-size defaults to the whole rollout (one optimizer step)
        "num_rollout": 600,
        "lr": 3e-3,
        "entropy_coef": 0.01,  # keeps groups diverse; without it GRPO collapses per prompt near 0.35 reward
        "weight_decay": 0.0,
        "advantage_estimator": "grpo",
    }


PRESETS: dict[str, Any] = {"quickstart": _quickstart}


def get_preset(name: str) -> dict[str, Any]:
    from relax.utils.arguments import ConfigError

    try:
        return PRESETS[name]()
    except KeyError:
        raise ConfigError(f"unknown --preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None
