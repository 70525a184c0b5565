"""Checkpoint layout, save and resume.

``<save>/iter_<step:07d>/`` holds the trainer's ``model.safetensors``, ``optimizer.pt`` (unless
``--no-save-optim``) and ``rng.pt`` (the Megatron backend: a sharded megatron-core checkpoint,
relax/backends/megatron/checkpoint.py, marked by ``megatron.json``), and the driver's
``driver_state.pkl`` (next step, data source position and buffer, weight version). ``<save>/latest_checkpointed_iteration.txt``
names the newest complete one and is written last, atomically, so a crash mid-save never
leaves a half-written checkpoint marked as latest; a checkpoint is written as ``iter_<step:07d>.partial/`` and
renamed when complete (`begin`, `publish`), so no torn ``iter_*`` directory is ever left. `CheckpointConfig` is the
driver's slice of the checkpoint flags; `prune` applies ``--max-actor-ckpt-to-keep`` and ``--rotate-ckpt``.
With ``--critic-save`` other than ``--save`` the critic's files go to ``<critic-save>/iter_<step:07d>/`` (same layout,
its own latest marker).
"""

from __future__ import annotations

import pickle
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax.utils.flag_slice import FlagSlice
from relax.utils.flag_types import ConfigError, ConfigErrors

LATEST_FILE = "latest_checkpointed_iteration.txt"
TRAINER_FILES = ("model.safetensors", "megatron.json")  # torch backend / Megatron backend (written last by rank 0)
CRITIC_FILES = ("critic.safetensors",)
_ITER_DIR = re.compile(r"^iter_(\d{7})$")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or unreadable."""


@dataclass(frozen=True)
class CheckpointConfig(FlagSlice):
    """What the driver saves, where, how often, how many it keeps, and where a run resumes."""

    save: str | None
    save_interval: int | None
    load: str | None
    no_save_optim: bool
    async_save: bool
    rotate_ckpt: bool
    max_actor_ckpt_to_keep: int | None
    start_rollout_id: int | None
    critic_save: str | None
    critic_load: str | None
    advantage_estimator: str
    train_backend: str
    num_rollout: int | None
    # which saved step of a relax checkpoint directory a frozen model loads
    opd_teacher_load: str | None
    opd_teacher_ckpt_step: int | None
    opd_type: str | None

    @property
    def critic_save_dir(self) -> str | None:
        """Where the critic's files go when not beside the actor's (``--critic-save`` other than ``--save``)."""
        return self.critic_save if self.critic_save and self.critic_save != self.save else None

    @property
    def critic_load_dir(self) -> str | None:
        """Where the critic is loaded from when not the ``--load`` checkpoint itself."""
        return self.critic_load if self.critic_load and self.critic_load != self.load else None

    def due(self, step: int) -> bool:
        """Step ``step`` is saved: the last step, every ``--save-interval``-th, every step with ``--rotate-ckpt``."""
        if not self.save:
            return False
        return self.rotate_ckpt or step == self.num_rollout - 1 or bool(
            self.save_interval and (step + 1) % self.save_interval == 0)

    def _step_problems(self) -> list[str]:
        return _teacher_step_problems(self)

    def validate(self) -> None:
        problems = []
        if self.rotate_ckpt:
            missing = [f for f, v in (("--save", self.save), ("--save-interval", self.save_interval),
                                      ("--async-save", self.async_save)) if not v]
            if missing:
                problems.append(f"--rotate-ckpt requires {', '.join(missing)}")
        # --critic-load equal to --load is its default (filled in after the rules run: relax/utils/validation.py)
        for flag, value in (("--critic-save", self.critic_save_dir), ("--critic-load", self.critic_load_dir)):
            if value and self.advantage_estimator != "ppo":
                problems.append(f"{flag}: only with --advantage-estimator ppo (the critic); got "
                                f"{self.advantage_estimator}")
        if self.critic_save and not self.save:
            problems.append("--critic-save requires --save (the critic is saved with each actor checkpoint)")
        if self.critic_load and not self.load:
            problems.append("--critic-load requires --load (the critic is loaded when the actor resumes)")
        if self.start_rollout_id is not None and self.num_rollout is not None and \
                self.start_rollout_id >= self.num_rollout:
            problems.append(f"--start-rollout-id {self.start_rollout_id} must be below --num-rollout "
                            f"{self.num_rollout} (nothing would train)")
        problems += self._step_problems()
        if problems:
            raise ConfigErrors(problems) if len(problems) > 1 else ConfigError(problems[0])


@dataclass
class DriverState:
    next_step: int
    weight_version: int
    data_source: dict[str, Any]


def _teacher_step_problems(cfg: CheckpointConfig) -> list[str]:
    step, root = cfg.opd_teacher_ckpt_step, cfg.opd_teacher_load
    if step is None:
        if cfg.opd_type != "megatron" or not root or not is_checkpoint_root(root):
            return []
        try:  # the latest checkpoint of a relax train --save directory
            return backend_problems(find_latest(root, flag="--opd-teacher-load", driver_state=False),
                                    cfg.train_backend, "--opd-teacher-load")
        except CheckpointError as exc:
            return [str(exc)]
    if cfg.opd_type != "megatron":
        return [f"not supported yet: --opd-teacher-ckpt-step with --opd-type {cfg.opd_type} (the teacher in the "
                "trainer, --opd-type megatron, only)"]
    if not root or not is_checkpoint_root(root):
        return [f"--opd-teacher-ckpt-step {step}: --opd-teacher-load {root} is not a relax train --save "
                f"directory (no {LATEST_FILE})"]
    try:
        directory = find_step(root, step, flag="--opd-teacher-ckpt-step")
    except CheckpointError as exc:
        return [str(exc)]
    return backend_problems(directory, cfg.train_backend, "--opd-teacher-load")


def backend_problems(directory: Path, train_backend: str, flag: str) -> list[str]:
    """A checkpoint that ``train_backend`` cannot read as a model's weights (``--ref-load``, ``--opd-teacher-load``):
    the torch backend reads ``model.safetensors``, the Megatron backend its sharded ``mcore/`` (``megatron.json``)."""
    saved = "megatron" if (directory / "megatron.json").exists() else "torch"
    if saved == train_backend:
        return []
    return [f"{flag}: {directory} was saved by --train-backend {saved}; --train-backend {train_backend} reads only "
            "its own checkpoints"]


def iteration_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"iter_{step:07d}"


PARTIAL_SUFFIX = ".partial"


def begin(root: str | Path, step: int) -> Path:
    """Where step ``step``'s checkpoint is written until `publish`: ``iter_<step>.partial`` (one a run left torn,
    e.g. killed mid-save, is removed first). Nothing under that name is ever loaded."""
    partial = Path(f"{iteration_dir(root, step)}{PARTIAL_SUFFIX}")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    return partial


def save_failure(root: str | Path, step: int, exc: BaseException) -> CheckpointError:
    """One line for a checkpoint that could not be written: the step, where, the cause's first line and the free
    space there (a full disk shows up as ENOSPC, or inside torch's writer as ``unexpected pos``)."""
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


def find_latest(root: str | Path, *, flag: str = "--load", files: tuple[str, ...] = TRAINER_FILES,
                driver_state: bool = True) -> Path:
    """The newest complete checkpoint under ``root`` (the one its latest marker names)."""
    root = Path(root)
    marker = root / LATEST_FILE
    if not root.is_dir():
        raise CheckpointError(f"{flag}: checkpoint directory not found: {root}")
    if not marker.exists():
        raise CheckpointError(f"{flag}: no {LATEST_FILE} in {root} (no complete checkpoint)")
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{flag}: {marker} holds {text[:40]!r}, not a step number")
    return _complete(iteration_dir(root, int(text)), flag, files, driver_state)


def is_checkpoint_root(path: str | Path) -> bool:
    """Whether ``path`` is a ``relax train --save`` directory (it holds the latest marker)."""
    return (Path(path) / LATEST_FILE).is_file()


def find_step(root: str | Path, step: int, *, flag: str, files: tuple[str, ...] = TRAINER_FILES) -> Path:
    """Step ``step``'s checkpoint under ``root`` (``--ref-ckpt-step``, ``--opd-teacher-ckpt-step``); one line
    naming the steps there when it is absent."""
    directory = iteration_dir(root, step)
    if not directory.is_dir():
        have = ", ".join(str(s) for s in saved_steps(root)) or "none"
        raise CheckpointError(f"{flag} {step}: no checkpoint of step {step} in {root} (saved steps: {have})")
    return _complete(directory, flag, files, driver_state=False)


def _complete(directory: Path, flag: str, files: tuple[str, ...], driver_state: bool) -> Path:
    if not any((directory / name).exists() for name in files):
        raise CheckpointError(f"{flag}: checkpoint {directory} is incomplete: missing {' or '.join(files)}")
    if driver_state and not (directory / "driver_state.pkl").exists():
        raise CheckpointError(f"{flag}: checkpoint {directory} is incomplete: missing driver_state.pkl")
    return directory


def saved_steps(root: str | Path) -> list[int]:
    """The steps of the published ``iter_<step>`` directories under ``root``, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    matches = (_ITER_DIR.match(d.name) for d in root.iterdir() if d.is_dir())
    return sorted(int(m.group(1)) for m in matches if m)


def prune(root: str | Path, *, keep: int | None, rotate_interval: int | None = None) -> list[int]:
    """Remove old published checkpoints under ``root``; returns the steps removed. The newest always stays.

    ``keep`` alone (``--max-actor-ckpt-to-keep``): the newest ``keep`` stay. With ``rotate_interval``
    (``--rotate-ckpt``, every step saved): besides the newest, only the ``--save-interval`` checkpoints stay
    (steps ``s`` with ``(s + 1) % interval == 0``), the newest ``keep`` of them when ``keep`` is set.
    """
    steps = saved_steps(root)[::-1]  # newest first
    if not steps:
        return []
    newest, older = steps[0], steps[1:]
    if rotate_interval:
        milestones = [s for s in older if (s + 1) % rotate_interval == 0]
        kept = set(milestones if keep is None else milestones[:keep])
    elif keep is not None:
        kept = set(older[:max(keep - 1, 0)])
    else:
        return []
    kept.add(newest)
    removed = [s for s in steps if s not in kept]
    for step in removed:
        shutil.rmtree(iteration_dir(root, step), ignore_errors=True)
    return sorted(removed)


def read_driver_state(directory: Path) -> DriverState:
    try:
        with open(directory / "driver_state.pkl", "rb") as fh:
            return pickle.load(fh)
    except Exception as exc:  # noqa: BLE001 - unpickling bad bytes raises anything (ValueError, KeyError, ...)
        raise CheckpointError(f"--load: cannot read {directory / 'driver_state.pkl'}: "
                              f"{type(exc).__name__}: {exc}") from None
