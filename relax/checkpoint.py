"""Checkpoint layout, save and resume.

``<save>/iter_<step:07d>/`` holds the trainer's ``model.safetensors``, ``optimizer.pt`` (unless
``--no-save-optim``) and ``rng.pt`` (the Megatron backend: a sharded megatron-core checkpoint,
relax/backends/megatron/checkpoint.py, marked by ``megatron.json``), and the driver's
``driver_state.pkl`` (next step, data source position and buffer, weight version). ``<save>/latest_checkpointed_iteration.txt``
names the newest complete one and is written last, atomically, so a crash mid-save never
leaves a half-written checkpoint marked as latest.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_FILES = ("model.safetensors", "megatron.json")  # torch backend / Megatron backend (written last by rank 0)


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or unreadable."""


@dataclass
class DriverState:
    next_step: int
    weight_version: int
    data_source: dict[str, Any]


def iteration_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


def write_driver_state(directory: Path, state: DriverState) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "driver_state.pkl", "wb") as fh:
        pickle.dump(state, fh)


def mark_latest(root: str | Path, step: int) -> None:
    root = Path(root)
    tmp = root / (LATEST_FILE + ".tmp")
    tmp.write_text(str(step))
    tmp.replace(root / LATEST_FILE)


def find_latest(root: str | Path) -> Path:
    root = Path(root)
    marker = root / LATEST_FILE
    if not root.is_dir():
        raise CheckpointError(f"--load: checkpoint directory not found: {root}")
    if not marker.exists():
        raise CheckpointError(f"--load: no {LATEST_FILE} in {root} (no complete checkpoint)")
    directory = iteration_dir(root, int(marker.read_text().strip()))
    if not any((directory / name).exists() for name in TRAINER_FILES):
        raise CheckpointError(f"--load: checkpoint {directory} is incomplete: missing {' or '.join(TRAINER_FILES)}")
    if not (directory / "driver_state.pkl").exists():
        raise CheckpointError(f"--load: checkpoint {directory} is incomplete: missing driver_state.pkl")
    return directory


def read_driver_state(directory: Path) -> DriverState:
    try:
        with open(directory / "driver_state.pkl", "rb") as fh:
            return pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError) as exc:
        raise CheckpointError(f"--load: cannot read {directory / 'driver_state.pkl'}: {exc}") from None
