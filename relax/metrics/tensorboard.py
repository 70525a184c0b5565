"""TensorBoard mirror of metrics.jsonl (``--use-tensorboard``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any


class TensorBoardLogger:
    """Writes every numeric metric as a scalar at its step.

    The log dir follows the seed's flags: ``--tb-project-name`` (default: $TENSORBOARD_DIR, else
    ``<output-dir>/tensorboard``) / ``--tb-experiment-name`` (default: the output dir's name).
    """

    def __init__(self, output_dir: str, project: str | None, experiment: str | None):
        from torch.utils.tensorboard import SummaryWriter

        root = project or os.environ.get("TENSORBOARD_DIR") or str(Path(output_dir) / "tensorboard")
        self.log_dir = Path(root) / (experiment or Path(output_dir).resolve().name)
        self._writer = SummaryWriter(log_dir=str(self.log_dir))

    def log(self, metrics: dict[str, Any]) -> None:
        step = int(metrics["step"])
        for key, value in metrics.items():
            if key in ("step", "time") or not isinstance(value, int | float):
                continue
            self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()
