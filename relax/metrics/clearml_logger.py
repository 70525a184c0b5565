"""ClearML mirror of metrics.jsonl (``--use-clearml``).

clearml is the optional extra ``clearml`` (``pip install 'relax-harness[clearml]'``); without it the flag is
refused at launch in one line. The run is one ClearML task, ``Task.init(project_name=--tb-project-name,
task_name=--tb-experiment-name)`` (defaults: ``relax`` and the output dir's name), the run's config is
``task.connect``-ed, and every numeric metric of a step is ``report_scalar(title, series, value, iteration=step)``
with ``title/series`` split at the metric's first ``/`` (``train/loss``: title ``train``, series ``loss``; a
name without ``/`` is its own title and series). ``CLEARML_OFFLINE_MODE=1`` (ClearML's own switch) keeps it
offline.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relax.utils.flag_slice import FlagSlice

INSTALL = "pip install 'relax-harness[clearml]'"


@dataclass(frozen=True)
class ClearMLConfig(FlagSlice):
    use_clearml: bool
    tb_project_name: str | None
    tb_experiment_name: str | None
    output_dir: str

    def validate(self) -> None:
        if self.use_clearml and importlib.util.find_spec("clearml") is None:
            raise ValueError(f"--use-clearml needs clearml, which is not installed: {INSTALL}")

    @property
    def project(self) -> str:
        return self.tb_project_name or "relax"

    @property
    def task_name(self) -> str:
        return self.tb_experiment_name or Path(self.output_dir).resolve().name


def split_name(key: str) -> tuple[str, str]:
    title, _, series = key.partition("/")
    return (title, series) if series else (key, key)


class ClearMLLogger:
    """A step logger (RunArtifacts.add_step_logger): one ClearML task per run."""

    def __init__(self, cfg: ClearMLConfig, config: dict[str, Any]):
        from clearml import Task

        self.task = Task.init(project_name=cfg.project, task_name=cfg.task_name)
        self.task.connect(config)
        self._logger = self.task.get_logger()

    def log(self, metrics: dict[str, Any]) -> None:
        step = int(metrics["step"])
        for key, value in metrics.items():
            if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            title, series = split_name(key)
            self._logger.report_scalar(title, series, value, iteration=step)

    def close(self) -> None:
        self.task.close()
