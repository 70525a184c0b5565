"""A checkpoint's files as a host snapshot, written now or in a background thread (``--async-save``).

A backend lists what a checkpoint holds as `HostFile` s whose payloads are host copies (`to_host`), taken
while training is paused; `write_files` then writes them. With ``--async-save`` a `BackgroundWrite` writes the
snapshot while the next step trains: the snapshot shares no storage with the live model or optimizer, so
training cannot change what is being written. A failed write names the file it was writing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch


class CheckpointWriteError(RuntimeError):
    """One file of a checkpoint could not be written; the message names the file."""


@dataclass
class HostFile:
    path: Path
    kind: str  # "safetensors" (a flat name -> tensor dict) or "torch" (anything torch.save writes)
    payload: Any


def to_host(obj: Any) -> Any:
    """A copy of ``obj`` whose tensors are host tensors sharing no storage with the originals."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True).contiguous()
    if isinstance(obj, dict):
        return {k: to_host(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [to_host(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(to_host(v) for v in obj)
    return obj


def write_files(files: list[HostFile], after: Callable[[], None] | None = None) -> None:
    """Write ``files`` (their directories made first); ``after`` runs once all are written."""
    from safetensors.torch import save_file

    for f in files:
        try:
            f.path.parent.mkdir(parents=True, exist_ok=True)
            if f.kind == "safetensors":
                save_file(f.payload, str(f.path))
            else:
                torch.save(f.payload, f.path)
        except Exception as exc:  # noqa: BLE001 - any failure: one line naming the file
            first = next((line.strip() for line in str(exc).splitlines() if line.strip()), "(no message)")
            raise CheckpointWriteError(f"writing {f.path}: {type(exc).__name__}: {first}") from exc
    if after is not None:
        after()


class BackgroundWrite:
    """`write_files` in a daemon thread; `status` says ``running``, ``done`` or the failure's one line."""

    def __init__(self, files: list[HostFile], after: Callable[[], None] | None = None):
        self._error: str | None = None
        self._thread = threading.Thread(target=self._run, args=(files, after), name="relax-async-save", daemon=True)
        self._thread.start()

    def _run(self, files: list[HostFile], after: Callable[[], None] | None) -> None:
        try:
            write_files(files, after)
        except Exception as exc:  # noqa: BLE001 - reported through status()
            self._error = str(exc) if isinstance(exc, CheckpointWriteError) else f"{type(exc).__name__}: {exc}"

    def status(self) -> str:
        if self._thread.is_alive():
            return "running"
        return self._error or "done"

    def join(self) -> str:
        self._thread.join()
        return self.status()
