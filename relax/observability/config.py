"""The observability flags as typed slices: the driver's timeline, the trainer's profiler."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from relax.utils.flag_slice import FlagSlice


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
        experiment = self.tb_experiment_name or Path(self.output_dir).resolve().name
        return Path(self.output_dir) / "traces" / experiment / "train_trace"

    def profiles(self, target: str, offset: int) -> bool:
        return (self.use_pytorch_profiler and target in (self.profile_target or ())
                and self.profile_step_start <= offset <= self.profile_step_end)
