"""Named bundles of flag values for ``--preset`` (keyed by flag dest names).

Precedence when parsing: documented defaults < preset < ``--config`` / ``--custom-config-path``
files < explicit command-line flags, whatever their order on the command line.
Every preset is parsed by a parametrized test (tests/test_arguments.py).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import relax
from relax.utils.flag_types import ConfigError

_TASKS = Path(relax.__file__).resolve().parent / "models" / "tasks"

# CPU GRPO on the `maxdigit` task (``a,b=`` -> max(a, b)) with the 80k-param tiny-qwen3: reward goes
# from ~0.01 to ~0.8 by step 100 and ~0.95 by step 200, and stays there (0.955-0.957 over the last 20
# steps for --seed 1234, 1 and 2: ci/demo_seeds.py, docs/results/demo_seeds_cpu.json), ~2-3 minutes on 2 cores.
QUICKSTART: dict[str, Any] = {
    "train_backend": "torch",
    "device": "cpu",
    "colocate": True,
    "hf_checkpoint": "tiny-qwen3",
    "prompt_data": str(_TASKS / "maxdigit.jsonl"),
    "input_key": "prompt",
    "label_key": "label",
    "rm_type": "exact",
    "rollout_shuffle": True,
    "rollout_batch_size": 32,
    "n_samples_per_prompt": 8,
    "rollout_max_response_len": 1,
    "rollout_temperature": 1.0,
    "micro_batch_size": 64,  # --global-batch-size defaults to the whole rollout (one optimizer step)
    "num_rollout": 300,
    # Not faster: the labels are skewed to high digits (max of two digits: "9" answers 19 prompts, "0" one). At 3e-3
    # the entropy fell from 4.4 to 0.1-0.5 by steps 60-80, before the rare low answers were learned; those prompts
    # then give the lowest learned digit in all 8 samples, a zero-advantage group that the entropy bonus cannot
    # free (its gradient vanishes on a deterministic policy): 4-16 of the 100 prompts stuck for good, final reward
    # 0.84-0.96 by seed. At 1e-3 the entropy is ~1.1 at steps 80-100 and only the 4 prompts answered 0 or 1 stay.
    "lr": 1e-3,
    "entropy_coef": 0.01,  # keeps groups diverse; without it GRPO collapses per prompt near 0.35 reward
    "weight_decay": 0.0,
    "advantage_estimator": "grpo",
}

# CPU GRPO on the `colorshape` picture task (relax/models/tasks/shapes.py: "Colour of the square?" -> r/g/b/y)
# with the 129k-param tiny-qwen2.5-vl, whose 1-block vision tower trains too: the image is the only
# place the answer is. Measured on 2 cores (seed 1234): reward 0.016 at step 0, ~0.2 over steps 25-29 (the letters
# learned), 0.43-0.47 over steps 50-59 (above the 0.25 of guessing among them: the picture is read); ~80 s.
VLM_QUICKSTART: dict[str, Any] = {
    **{k: QUICKSTART[k] for k in ("train_backend", "device", "colocate", "rm_type", "rollout_shuffle",
                                  "rollout_max_response_len", "rollout_temperature", "weight_decay",
                                  "advantage_estimator", "entropy_coef")},
    "hf_checkpoint": "tiny-qwen2.5-vl",
    "prompt_data": str(_TASKS / "colorshape.jsonl"),
    "input_key": "prompt",
    "label_key": "label",
    "apply_chat_template": True,
    "multimodal_keys": {"image": "images"},
    "rollout_batch_size": 16,
    "n_samples_per_prompt": 8,
    "micro_batch_size": 64,
    "num_rollout": 60,
    "lr": 3e-3,
}

PRESETS: dict[str, dict[str, Any]] = {
    "quickstart": QUICKSTART,
    "vlm-quickstart": VLM_QUICKSTART,
}


def get_preset(name: str) -> dict[str, Any]:
    """A copy of the preset's values (dest -> value); ConfigError listing the known names otherwise."""
    try:
        return dict(PRESETS[name])
    except KeyError:
        raise ConfigError(f"unknown --preset {name!r}; known presets: {', '.join(sorted(PRESETS))}") from None
