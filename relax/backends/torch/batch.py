"""Turning rollout samples into padded tensors for the torch backend.

Layout: every per-token tensor is ``[N, T]`` over *response* tokens, right-padded, where
``N`` is the number of samples in the rollout and ``T`` the longest response. Micro-batches
are row slices of these tensors, so old/ref log-probs, advantages and the loss all index the
same rows; no re-packing happens between phases.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from relax.algorithms import AdvantageOutput, AlgorithmConfig, compute_advantages


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


def _pad_rows(rows: list[list[float]], width: int, dtype: torch.dtype) -> torch.Tensor:
    out = torch.zeros(len(rows), width, dtype=dtype)
    for i, row in enumerate(rows):
        if row:
            out[i, : len(row)] = torch.tensor(row, dtype=dtype)
    return out


def build_rollout_tensors(samples: list[TrainSample]) -> RolloutTensors:
    for i, s in enumerate(samples):
        if len(s.loss_mask) != s.response_length:
            raise ValueError(f"sample {i}: loss_mask has {len(s.loss_mask)} entries for {s.response_length} tokens")
    width = max((s.response_length for s in samples), default=0)
    rollout = None
    if all(s.rollout_log_probs is not None for s in samples):
        rollout = _pad_rows([s.rollout_log_probs or [] for s in samples], width, torch.float32)
    teacher = None
    if all(s.teacher_log_probs is not None for s in samples):
        teacher = _pad_rows([s.teacher_log_probs or [] for s in samples], width, torch.float32)
    return RolloutTensors(
        samples=samples,
        rewards=torch.tensor([float(s.reward) for s in samples], dtype=torch.float32),
        loss_mask=_pad_rows([[float(m) for m in s.loss_mask] for s in samples], width, torch.float32),
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


def build_model_inputs(samples: list[TrainSample], width: int, pad_id: int, device: Any) -> ModelInputs:
    seq_len = max(len(s.tokens) for s in samples)
    b = len(samples)
    input_ids = torch.full((b, seq_len), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((b, seq_len), dtype=torch.long)
    positions = torch.zeros((b, width), dtype=torch.long)
    targets = torch.full((b, width), pad_id, dtype=torch.long)
    valid = torch.zeros((b, width), dtype=torch.bool)
    for i, s in enumerate(samples):
        n = len(s.tokens)
        input_ids[i, :n] = torch.tensor(s.tokens, dtype=torch.long)
        attention_mask[i, :n] = 1
        r = s.response_length
        if r:
            positions[i, :r] = torch.arange(s.prompt_length - 1, n - 1)
            targets[i, :r] = input_ids[i, s.prompt_length : n]
            valid[i, :r] = True
    return ModelInputs(
        input_ids.to(device), attention_mask.to(device), positions.to(device), targets.to(device), valid.to(device)
    )


def rollout_advantages(algo: AlgorithmConfig, batch: RolloutTensors, group_size: int, old_log_probs: torch.Tensor,
                       ref_log_probs: torch.Tensor | None, values: torch.Tensor | None = None,
                       teacher_log_probs: torch.Tensor | None = None) -> AdvantageOutput:
    """`compute_advantages` over a rollout batch: the trainer's and the advantages service's one call."""
    return compute_advantages(algo, rewards=batch.rewards, loss_mask=batch.loss_mask, group_size=group_size,
                              old_log_probs=old_log_probs, ref_log_probs=ref_log_probs, values=values,
                              teacher_log_probs=teacher_log_probs)
