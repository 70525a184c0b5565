"""The observability flags as typed slices: the driver's timeline, the trainer's profiler."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relax.utils.flag_slice import FlagSlice


def traces_dir(output_dir: str, tb_experiment_name: str | None, kind: str) -> Path:
    """The seed's ``traces/<tb_experiment_name>/<kind>`` under ``--output-dir``; without an experiment name, the
    output dir's own name stands for it. Shared by the trainer's profiler, the engines' and the memory snapshots."""
    experiment = tb_experiment_name or Path(output_dir).resolve().name
    return Path(output_dir) / "traces" / experiment / kind


@dataclass(frozen=True)
class TimelineConfig(FlagSlice):
    """``--timeline-dump-dir``: where the driver writes the run's Chrome trace (None: no timeline)."""

    timeline_dump_dir: str | None
    output_dir: str

    @property
    def enabled(self) -> bool:
        return bool(self.timeline_dump_dir)


@dataclass(frozen=True)
class ProfilerConfig(FlagSlice):
    """What the trainer ranks record: torch.profiler traces of some steps, and the timeline's trainer spans."""

    use_pytorch_profiler: bool
    profile_step_start: int
    profile_step_end: int
    profile_target: list[str]
    profile_with_stack: bool
    profile_with_memory: bool
    profile_with_flops: bool
    output_dir: str
    tb_experiment_name: str | None
    timeline_dump_dir: str | None

    @property
    def trace_dir(self) -> Path:
        """``<output-dir>/traces/<tb-experiment-name, default the output dir's name>/train_trace``."""
        return traces_dir(self.output_dir, self.tb_experiment_name, "train_trace")

    def profiles(self, target: str, offset: int) -> bool:
        return (self.use_pytorch_profiler and target in (self.profile_target or ())
                and self.profile_step_start <= offset <= self.profile_step_end)
