"""The typed slice of flags the SGLang launcher reads (relax/backends/sglang/launcher.py).

What each ``sglang.launch_server`` command is made of: the model (``--hf-checkpoint``, or a preset written
under ``--output-dir``) in the trainer's export dtype, the GPUs of one engine, the seed, memory saving for
``--offload-rollout``, and seed 000's ``--sglang-*`` options (declared ones and the passthrough).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relax.utils.flag_slice import FlagSlice


@dataclass(frozen=True)
class SGLangLaunchConfig(FlagSlice):
    # the model the server loads, in the trainer's export dtype
    hf_checkpoint: str
    output_dir: str
    train_backend: str
    bf16: bool
    seed: int
    # one engine's GPUs (its tensor-parallel size)
    rollout_num_gpus_per_engine: int
    # --enable-memory-saver, so the colocated trainer can take the memory back
    offload_rollout: bool
    # SGLang's own options: the declared --sglang-* flags and every other --sglang-X passed through
    sglang_mem_fraction_static: float | None
    sglang_passthrough: dict[str, Any]
