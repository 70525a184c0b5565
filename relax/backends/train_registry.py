"""Training backends by ``--train-backend`` name: the one place that dispatches on it.

Each backend offers the same contract (`TorchTrainBackend`'s public methods: train_rollout,
named_tensors, weight_buckets, checksums, save, load, save_hf, describe). ``weight_dtype`` is
the dtype of the HF-named tensors a backend exports, which engines hold so that both sides'
checksums agree bit for bit.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from relax.backends.config import TrainerConfig


@dataclass(frozen=True)
class TrainBackendEntry:
    module: str
    cls: str
    weight_dtype: torch.dtype


TRAIN_BACKENDS: dict[str, TrainBackendEntry] = {
    "torch": TrainBackendEntry("relax.backends.torch.backend", "TorchTrainBackend", torch.float32),
    "megatron": TrainBackendEntry("relax.backends.megatron.backend", "MegatronTrainBackend", torch.bfloat16),
}


def build_train_backend(cfg: TrainerConfig, device: str, *, service: str | None = None) -> Any:
    """``service`` (``reference`` or ``actor_fwd``): a forward-only copy (no optimizer, no grads) for that
    fully-async service role; the reference copy holds the reference weights (``--ref-load``)."""
    if service not in (None, "reference", "actor_fwd"):
        raise ValueError(f"unknown service role {service!r}; known: reference, actor_fwd")
    entry = TRAIN_BACKENDS[cfg.train_backend]
    cls = getattr(importlib.import_module(entry.module), entry.cls)
    return cls(cfg, device, service=service) if service else cls(cfg, device)


def weight_dtype(train_backend: str, bf16: bool = False) -> torch.dtype:
    """The dtype of the tensors ``train_backend`` exports: its own, or bf16 when it trains with ``--bf16``
    (the torch backend then holds bf16 weights and fp32 masters). Engines build their model in it."""
    return torch.bfloat16 if bf16 else TRAIN_BACKENDS[train_backend].weight_dtype
