"""Core data types shared by rollout, rewards, algorithms and training.

`Sample` mirrors the Relax/slime public type that user recipes import
(`relax.utils.types.Sample`), so custom reward and generate functions written for
Relax run unchanged. One `Sample` is one response to one prompt; a *group* is the
list of `n_samples_per_prompt` samples that share a prompt.
"""

from __future__ import annotations

import enum
from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass
class Sample:
    """One prompt/response pair moving through rollout -> reward -> training.

    Token fields hold plain Python lists so samples cross process boundaries
    (Ray, HTTP, jsonl) without tensor serialization.
    """

    class Status(enum.Enum):
        PENDING = "pending"
        COMPLETED = "completed"
        TRUNCATED = "truncated"
        ABORTED = "aborted"
        FAILED = "failed"

    # identity
    index: int | None = None  # global sample index in this run
    group_index: int | None = None  # prompt id (index into the dataset, epoch-qualified)
    # prompt
    prompt: str | list[dict[str, Any]] = ""
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    multimodal_inputs: Any = None
    # generation: tokens = prompt tokens + response tokens
    tokens: list[int] = field(default_factory=list)
    response: str = ""
    response_length: int = 0
    loss_mask: list[int] | None = None  # one entry per response token; None means all ones
    rollout_log_probs: list[float] | None = None  # one per response token
    teacher_log_probs: list[float] | None = None
    status: Status = Status.PENDING
    weight_version: int | None = None  # policy version that generated the response (last segment)
    # per response token: the policy version that generated it (a resumed partial rollout mixes versions)
    token_weight_versions: list[int] | None = None
    abort_count: int = 0
    # reward
    reward: float | dict[str, Any] | None = None

    @property
    def prompt_length(self) -> int:
        return len(self.tokens) - self.response_length

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def effective_loss_mask(self) -> list[int]:
        return self.loss_mask if self.loss_mask is not None else [1] * self.response_length

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["status"] = self.status.value
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Sample:
        d = dict(d)
        d["status"] = cls.Status(d.get("status", "pending"))
        return cls(**d)
