"""Checkpoint layout, save and resume.

``<save>/iter_<step:07d>/`` holds the trainer's ``model.safetensors``, ``optimizer.pt`` (unless
``--no-save-optim``) and ``rng.pt`` (the Megatron backend: a sharded megatron-core checkpoint,
relax/backends/megatron/checkpoint.py, marked by ``megatron.json``), and the driver's
``driver_state.pkl`` (next step, data source position and buffer, weight version). ``<save>/latest_checkpointed_iteration.txt``
names the newest complete one and is written last, atomically, so a crash mid-save never
leaves a half-written checkpoint marked as latest; a checkpoint is written as ``iter_<step:07d>.partial/`` and
renamed when complete (`begin`, `publish`), so no torn ``iter_*`` directory is ever left.
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


PARTIAL_SUFFIX = ".partial"


def begin(root: str | Path, step: int) -> Path:
    """Where step ``step``'s checkpoint is written until `publish`: ``iter_<step>.partial`` (one a run left torn,
    e.g. killed mid-save, is removed first). Nothing under that name is ever loaded."""
    import shutil

    partial = Path(f"{iteration_dir(root, step)}{PARTIAL_SUFFIX}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def save_failure(root: str | Path, step: int, exc: BaseException) -> CheckpointError:
    """One line for a checkpoint that could not be written: the step, where, the cause's first line and the free
    space there (a full disk shows up as ENOSPC, or inside torch's writer as ``unexpected pos``)."""
    import shutil

    from relax.utils.errors import unwrap

    original, _ = unwrap(exc)
    cause = next((line.strip() for line in str(original).splitlines() if line.strip()), "(no message)")
    probe = Path(root)
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    try:
        free = f"{shutil.disk_usage(probe).free / 2**20:.1f} MiB free there"
    except OSError:
        free = "free space unknown"
    return CheckpointError(f"checkpoint of step {step} to {root} failed: {type(original).__name__}: {cause} ({free})")


def publish(root: str | Path, step: int) -> Path:
    """The complete ``iter_<step>.partial`` becomes ``iter_<step>`` (one rename; an older checkpoint of the same
    step, from a run resumed before it, is replaced), then `mark_latest`: a checkpoint is complete or absent."""
    import shutil

    final = iteration_dir(root, step)
    partial = Path(f"{final}{PARTIAL_SUFFIX}")
    if final.exists():
        shutil.rmtree(final)
    partial.rename(final)
    mark_latest(root, step)
    return final


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
