"""The driver's side of checkpoints: when a step is saved, where, how many are kept, and ``--async-save``.

A save writes ``iter_<step>.partial`` (the trainer's files, then the driver's state) and publishes it
(relax/checkpoint.py), then prunes old ones (``--max-actor-ckpt-to-keep``, ``--rotate-ckpt``). With
``--async-save`` the trainer takes a host copy of its state and writes it in a thread while the next step
trains (relax/checkpoint_io.py; Megatron: megatron-core's async save on every rank,
relax/backends/megatron/async_save.py); a driver thread waits for it, then publishes and prunes. The driver waits for a
save in flight before the next save and after the last step, and a failed write ends the run with one line
naming the file.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ray

from relax import checkpoint as ckpt
from relax.metrics.artifacts import RunArtifacts
from relax.utils.fault_hooks import fault_at

POLL_S = 0.05  # how often the driver asks the trainer whether its background write is done


@dataclass
class CheckpointSaver:
    cfg: ckpt.CheckpointConfig
    trainer: object  # rank 0's actor handle
    artifacts: RunArtifacts
    _thread: threading.Thread | None = None
    _failure: BaseException | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def due(self, step: int) -> bool:
        return self.cfg.due(step)

    def save(self, step: int, position: Callable[[], dict]) -> None:
        """Save step ``step``; ``position`` gives the data source's position after the step's prompts."""
        cfg = self.cfg
        self.wait()  # one save in flight at a time; a failed one ends the run here at the latest
        self.artifacts.event("phase", step=step, phase="checkpoint")
        try:
            if fault_at("CKPT_WRITE_FAIL", step):
                raise OSError(28, "No space left on device (injected fault)", str(ckpt.iteration_dir(cfg.save, step)))
            partial = ckpt.begin(cfg.save, step)
            critic_partial = ckpt.begin(cfg.critic_save_dir, step) if cfg.critic_save_dir else None
            state = ckpt.DriverState(step + 1, step + 1, position())
            ray.get(self.trainer.save.remote(str(partial), not cfg.no_save_optim,
                                             str(critic_partial) if critic_partial else None, cfg.async_save))
        except Exception as exc:  # noqa: BLE001 - any failure of the save: one line naming where and the free space
            raise ckpt.save_failure(cfg.save, step, exc) from exc
        if not cfg.async_save:
            self._publish(step, partial, state)
            return
        self._thread = threading.Thread(target=self._finish_in_background, args=(step, partial, state),
                                        name="relax-async-save-publish", daemon=True)
        self._thread.start()

    def check(self) -> None:
        """Raise the failure of a background save, if one failed."""
        with self._lock:
            failure, self._failure = self._failure, None
        if failure is not None:
            raise failure

    def wait(self) -> None:
        """Wait for the save in flight (``--async-save``), then raise its failure, if any. The trainer is asked to
        finish it: a Megatron trainer finalizes its background saves only at a step's start or when asked (every
        rank together: relax/backends/megatron/async_save.py), and no step may follow (the last, or the next save)."""
        if self._thread is not None:
            try:
                ray.get(self.trainer.wait_save.remote())  # a failed write is its status line, which the thread reads
            except ray.exceptions.RayError:
                pass  # a dead trainer: the thread's next poll fails the same way and records it for check()
            self._thread.join()
            self._thread = None
        self.check()

    def _finish_in_background(self, step: int, partial: Path, state: ckpt.DriverState) -> None:
        try:
            while (status := ray.get(self.trainer.save_status.remote())) == "running":
                time.sleep(POLL_S)
            if status != "done":
                raise ckpt.CheckpointError(status)
            self._publish(step, partial, state)
        except Exception as exc:  # noqa: BLE001 - raised in the driver's loop by check() / wait()
            with self._lock:
                self._failure = ckpt.save_failure(self.cfg.save, step, exc)

    def _publish(self, step: int, partial: Path, state: ckpt.DriverState) -> None:
        cfg = self.cfg
        ckpt.write_driver_state(partial, state)
        if cfg.critic_save_dir:
            ckpt.publish(cfg.critic_save_dir, step)
        directory = ckpt.publish(cfg.save, step)
        self.artifacts.event("checkpoint_saved", step=step, path=str(directory), background=cfg.async_save)
        interval = cfg.save_interval if cfg.rotate_ckpt else None
        for root in filter(None, (cfg.save, cfg.critic_save_dir)):
            removed = ckpt.prune(root, keep=cfg.max_actor_ckpt_to_keep, rotate_interval=interval)
            if removed:
                self.artifacts.event("checkpoints_removed", path=root, steps=removed)
