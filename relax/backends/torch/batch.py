"""Turning rollout samples into padded tensors for the torch backend.

Layout: every per-token tensor is ``[N, T]`` over *response* tokens, right-padded, where
``N`` is the number of samples in the rollout and ``T`` the longest response. Micro-batches
are row slices of these tensors, so old/ref log-probs, advantages and the loss all index the
same rows; no re-packing happens between phases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

import numpy as np
import torch

from relax.algorithms import AdvantageOutput, AlgorithmConfig, compute_advantages
from relax.backends.torch.vision_inputs import VisionBatch, vision_batch


@dataclass
class TrainSample:
    """The slice of a `Sample` the trainer needs; plain lists so it pickles cheaply across Ray."""

    tokens: list[int]
    response_length: int
    loss_mask: list[int]
    reward: float
    rollout_log_probs: list[float] | None = None
    teacher_log_probs: list[float] | None = None
    sample_id: tuple[int, int] | None = None  # (group_index, index) of the rollout sample, for the consumed report
    routed_experts: str | None = None  # the engine's MoE routing (Sample.rollout_routed_experts), for routing replay
    vision: dict[str, Any] | None = None  # pixel_values + image_grid_thw of its images (relax/backends/torch/vision_inputs.py)

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length


@dataclass
class RolloutTensors:
    """All per-sample and per-token tensors of one rollout batch."""

    samples: list[TrainSample]
    rewards: torch.Tensor  # [N] float32
    loss_mask: torch.Tensor  # [N, T] float32
    rollout_log_probs: torch.Tensor | None  # [N, T]
    teacher_log_probs: torch.Tensor | None  # [N, T]

    @property
    def num_tokens(self) -> int:
        return int(self.loss_mask.sum().item())


@dataclass
class Precomputed:
    """Per-sample columns computed outside the trainer (the fully-async services, `relax.core.services`).

    Row i belongs to sample i; per-token columns are ``[N, T]`` like `RolloutTensors`. A column
    left None is computed by the trainer as usual; ``metrics`` come with ``advantages``.
    """

    old_log_probs: torch.Tensor | None = None
    ref_log_probs: torch.Tensor | None = None
    advantages: torch.Tensor | None = None
    returns: torch.Tensor | None = None
    metrics: dict[str, float] = field(default_factory=dict)

    def check_rows(self, n: int, width: int) -> None:
        for name in ("old_log_probs", "ref_log_probs", "advantages", "returns"):
            value = getattr(self, name)
            if value is not None and tuple(value.shape) != (n, width):
                raise ValueError(f"precomputed {name} has shape {tuple(value.shape)}, the batch needs {(n, width)}")


def _pad_rows(rows: list[list[float]], width: int, dtype: torch.dtype, what: str) -> torch.Tensor:
    """``[len(rows), width]``, row ``i`` starting with ``rows[i]``, zeros after. One conversion of all the
    values and one masked write (row-major, the order of the concatenation), not a tensor per row: with 64
    rows of 256 a row at a time cost milliseconds of the trainer's step."""
    lengths = torch.tensor([len(row) for row in rows], dtype=torch.long)
    too_long = (lengths > width).nonzero()
    if too_long.numel():
        i = int(too_long[0])
        raise ValueError(f"sample {i}: {what} has {len(rows[i])} entries for {width} response tokens at most")
    out = torch.zeros(len(rows), width, dtype=dtype)
    out[torch.arange(width) < lengths[:, None]] = _flat(rows, int(lengths.sum()), dtype)
    return out


def _flat(rows: Iterable[list], count: int, dtype: torch.dtype) -> torch.Tensor:
    """The rows' values back to back, converted by numpy (4x faster than ``torch.tensor`` on Python lists)."""
    return torch.from_numpy(np.fromiter(chain.from_iterable(rows), dtype=_NUMPY[dtype], count=count))


_NUMPY = {torch.float32: np.float32, torch.long: np.int64}


def build_rollout_tensors(samples: list[TrainSample]) -> RolloutTensors:
    for i, s in enumerate(samples):
        if len(s.loss_mask) != s.response_length:
            raise ValueError(f"sample {i}: loss_mask has {len(s.loss_mask)} entries for {s.response_length} tokens")
    width = max((s.response_length for s in samples), default=0)
    rollout = None
    if all(s.rollout_log_probs is not None for s in samples):
        rollout = _pad_rows([s.rollout_log_probs or [] for s in samples], width, torch.float32, "rollout_log_probs")
    teacher = None
    if all(s.teacher_log_probs is not None for s in samples):
        teacher = _pad_rows([s.teacher_log_probs or [] for s in samples], width, torch.float32, "teacher_log_probs")
    return RolloutTensors(
        samples=samples,
        rewards=torch.tensor([float(s.reward) for s in samples], dtype=torch.float32),
        loss_mask=_pad_rows([s.loss_mask for s in samples], width, torch.float32, "loss_mask"),
        rollout_log_probs=rollout,
        teacher_log_probs=teacher,
    )


@dataclass
class ModelInputs:
    """Right-padded model inputs for one micro-batch plus where each response token's logit sits."""

    input_ids: torch.Tensor  # [b, L]
    attention_mask: torch.Tensor  # [b, L]
    logit_positions: torch.Tensor  # [b, T]: position whose logits predict response token t
    target_ids: torch.Tensor  # [b, T]: the response token ids
    valid: torch.Tensor  # [b, T] bool: t < response_length
    vision: VisionBatch | None = None  # the rows' images, for a vision-language model


def build_model_inputs(samples: list[TrainSample], width: int, pad_id: int, device: Any) -> ModelInputs:
    """Built with whole-batch tensor ops from one conversion of all the tokens (see `_pad_rows`)."""
    lengths = torch.tensor([len(s.tokens) for s in samples], dtype=torch.long)
    responses = torch.tensor([s.response_length for s in samples], dtype=torch.long)
    if len(samples) and int(responses.max()) > width:
        i = int(responses.argmax())
        raise ValueError(f"sample {i}: {samples[i].response_length} response tokens, the batch is {width} wide")
    seq_len = int(lengths.max())
    in_row = torch.arange(seq_len) < lengths[:, None]
    input_ids = torch.full((len(samples), seq_len), pad_id, dtype=torch.long)
    input_ids[in_row] = _flat((s.tokens for s in samples), int(lengths.sum()), torch.long)
    t = torch.arange(width)
    valid = t < responses[:, None]
    # response token t of a row sits at prompt_length + t and is predicted by the logits at the position before
    at = (lengths - responses)[:, None] + t
    positions = torch.where(valid, at - 1, 0)
    targets = torch.where(valid, input_ids.gather(1, at.clamp(max=seq_len - 1)), pad_id)
    return ModelInputs(input_ids.to(device), in_row.long().to(device), positions.to(device), targets.to(device),
                       valid.to(device), vision_batch([getattr(s, "vision", None) for s in samples],
                                                      torch.arange(seq_len) < (lengths - responses)[:, None], device))


def rollout_advantages(algo: AlgorithmConfig, batch: RolloutTensors, group_size: int, old_log_probs: torch.Tensor,
                       ref_log_probs: torch.Tensor | None, values: torch.Tensor | None = None,
                       teacher_log_probs: torch.Tensor | None = None) -> AdvantageOutput:
    """`compute_advantages` over a rollout batch: the trainer's and the advantages service's one call."""
    return compute_advantages(algo, rewards=batch.rewards, loss_mask=batch.loss_mask, group_size=group_size,
                              old_log_probs=old_log_probs, ref_log_probs=ref_log_probs, values=values,
                              teacher_log_probs=teacher_log_probs)
