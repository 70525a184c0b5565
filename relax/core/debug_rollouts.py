"""Replayable rollouts (seed 000's Debug table): save each step's rollout, train on it again later.

``--save-debug-rollout-data PATH`` wraps the rollout function: every step's sample groups are
written to ``PATH.format(rollout_id=step)`` before they are trained on. ``--load-debug-rollout-data``
(``--debug-train-only``) replaces the rollout function by `SavedRollouts`, which reads them back,
so one rollout can be trained twice, e.g. under two parallel layouts, and the losses compared.

A file holds the groups exactly as the rollout function returned them: every `Sample` field
(tokens, response length, loss mask, rollout and teacher log-probs, reward, group and sample
index, weight versions, status, prompt, label, metadata). Training derives everything else from
them the same way it does after a live rollout (`to_train_samples`, then the trainer's
advantages), so the replay trains on the same numbers. JSON keeps the floats exact (Python
writes the shortest repr that reads back to the same double). Format: docs/artifacts.md.
"""

from __future__ import annotations

import json
import os
from argparse import Namespace
from pathlib import Path
from typing import Any

from relax.utils.flag_types import ConfigError
from relax.utils.types import Sample

FORMAT = "relax.debug_rollout"
VERSION = 1
_SAVE, _LOAD = "--save-debug-rollout-data", "--load-debug-rollout-data"


def rollout_path(template: str, rollout_id: int) -> Path:
    return Path(template.format(rollout_id=rollout_id))


class RolloutRecorder:
    """The rollout function, with every rollout it returns written under ``--save-debug-rollout-data``."""

    def __init__(self, rollout_fn, template: str):
        self.rollout_fn = rollout_fn
        self.template = template

    def __call__(self, args: Namespace, rollout_id: int, data_source: Any) -> list[list[Sample]]:
        groups = self.rollout_fn(args, rollout_id, data_source)
        save_rollout(rollout_path(self.template, rollout_id), rollout_id, groups)
        return groups


def save_rollout(path: Path, rollout_id: int, groups: list[list[Sample]]) -> None:
    """Write one rollout atomically (a reader never sees half a file)."""
    record = {"format": FORMAT, "version": VERSION, "rollout_id": rollout_id,
              "groups": [[sample.to_dict() for sample in group] for group in groups]}
    try:
        text = json.dumps(record, allow_nan=True)
    except TypeError as exc:
        raise ConfigError(f"{_SAVE} {path}: a sample field cannot be written as JSON ({exc})") from None
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    tmp.replace(path)


class SavedRollouts:
    """``--load-debug-rollout-data``: the rollout function and the data source of a ``--debug-train-only`` run.

    Step k trains on rollout k of the files (the one file when the path has no ``{rollout_id}``),
    subsampled to whole groups by ``--load-debug-rollout-data-subsample``. It has no position of
    its own to checkpoint: the step number is the position.
    """

    def __init__(self, args: Namespace):
        self.template = args.load_debug_rollout_data
        self.ratio = args.load_debug_rollout_data_subsample
        self.group_size = args.n_samples_per_prompt
        self.global_batch = args.global_batch_size
        self.per_step = "{rollout_id}" in self.template

    def available(self) -> int:
        """Rollouts on disk: the consecutive files from rollout 0 (1 for a path without ``{rollout_id}``)."""
        if not self.per_step:
            return int(rollout_path(self.template, 0).is_file())
        count = 0
        while rollout_path(self.template, count).is_file():
            count += 1
        return count

    def check_steps(self, num_rollout: int) -> None:
        """Fail at start, naming the file, when a step of the run has no rollout on disk."""
        for step in range(num_rollout if self.per_step else 1):
            path = rollout_path(self.template, step)
            if not path.is_file():
                raise ConfigError(f"{_LOAD}: {path} does not exist (rollout {step} of {num_rollout})")

    def __call__(self, args: Namespace, rollout_id: int, data_source: Any) -> list[list[Sample]]:
        path = rollout_path(self.template, rollout_id)
        groups = load_rollout(path)
        if self.ratio is not None:
            groups = groups[:max(1, round(self.ratio * len(groups)))]
        for i, group in enumerate(groups):
            if len(group) != self.group_size:
                raise ConfigError(f"{_LOAD} {path}: group {i} has {len(group)} samples; --n-samples-per-prompt is "
                                  f"{self.group_size}")
        total = sum(len(g) for g in groups)
        if total % self.global_batch:
            kept = f" (after --load-debug-rollout-data-subsample {self.ratio})" if self.ratio is not None else ""
            raise ConfigError(f"{_LOAD} {path}: {total} samples{kept}, not a multiple of --global-batch-size "
                              f"{self.global_batch}")
        return groups

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        """Nothing to restore: a resumed run reads the rollouts of its remaining steps."""


def load_rollout(path: Path) -> list[list[Sample]]:
    """The sample groups of one saved rollout; ConfigError naming the file when it is not one."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"{_LOAD}: {path} does not exist") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{_LOAD} {path}: not a saved rollout ({exc})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ConfigError(f"{_LOAD} {path}: not a saved rollout (no \"format\": \"{FORMAT}\")")
    if record.get("version") != VERSION:
        raise ConfigError(f"{_LOAD} {path}: format version {record.get('version')!r}; this relax reads {VERSION}")
    try:
        return [[Sample.from_dict(sample) for sample in group] for group in record["groups"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise ConfigError(f"{_LOAD} {path}: malformed sample ({type(exc).__name__}: {exc})") from None
