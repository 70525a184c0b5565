"""Checkpoints complete: whatever happened to the run (a signal mid-save, a crash), every checkpoint directory it
left under its ``--save`` dir is whole, none is left half written, and the latest marker names a whole one.

Whole: ``driver_state.pkl`` and the trainer's files (``model.safetensors`` for the torch backend, ``megatron.json``
for the Megatron one), the layout of relax/checkpoint.py. A torn save shows as an ``iter_*.partial`` directory
(relax writes there and renames when complete) or an ``iter_*`` one missing those files.
"""

from __future__ import annotations

from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register

LATEST = "latest_checkpointed_iteration.txt"
TRAINER_FILES = ("model.safetensors", "megatron.json")


@register("checkpoints_complete")
class CheckpointsComplete(CheckParams):
    kind: Literal["checkpoints_complete"] = "checkpoints_complete"
    run: str | None = None
    save_dir: str  # relative to the run's output dir

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        root = ctx.run(self.run).dir / self.save_dir
        if not root.is_dir():
            return self.result(False, f"no checkpoint directory {root}")
        problems = [f"{p.name}: a save left half written" for p in sorted(root.glob("iter_*.partial"))]
        whole = []
        for d in sorted(p for p in root.glob("iter_*") if p.is_dir() and not p.name.endswith(".partial")):
            if not (d / "driver_state.pkl").is_file() or not any((d / f).exists() for f in TRAINER_FILES):
                problems.append(f"{d.name}: incomplete (driver_state.pkl or the trainer's files missing)")
            else:
                whole.append(d.name)
        marker = root / LATEST
        if not marker.is_file():
            problems.append(f"no {LATEST}")
        elif f"iter_{int(marker.read_text().strip()):07d}" not in whole:
            problems.append(f"{LATEST} names step {marker.read_text().strip()}, not a whole checkpoint")
        if problems:
            return self.result(False, "; ".join(problems), details={"whole": whole})
        return self.result(True, f"{len(whole)} checkpoint(s), all whole; latest {marker.read_text().strip()}",
                           details={"whole": whole})
