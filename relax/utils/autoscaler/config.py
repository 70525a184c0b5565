"""``--autoscaler-config PATH``: the autoscaler's YAML file, as a typed pydantic model.

Every field is documented here, once (``Field(description=...)``); the shipped default
(relax/utils/autoscaler/autoscaler.yaml) repeats the values with a comment per field, and a test keeps the
two in step. A bad file is refused with one line per problem, each naming the field's path in the file
(``signals.rollout_share.scale_in_below: ...``).

A signal votes *out* (the fleet is too small), *in* (it is too big) or *hold*; a threshold left ``null``
never votes its direction, and a signal with both thresholds ``null`` (or with no value in this run mode)
abstains. The policy (relax/utils/autoscaler/policy.py) scales out when any signal votes out, and in only
when every signal that does not abstain votes in.
"""

from __future__ import annotations

from pathlib import Path
from typing import Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from relax.utils.field_paths import field_path
from relax.utils.flag_types import ConfigError, ConfigErrors

FLAG = "--autoscaler-config"
DEFAULT_PATH = Path(__file__).with_name("autoscaler.yaml")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BusyWhenHigh(_Strict):
    """A signal that rises with load (rollout time share, engine utilisation)."""

    scale_out_above: float | None = Field(None, ge=0, description="Vote out when the value is above this.")
    scale_in_below: float | None = Field(None, ge=0, description="Vote in when the value is below this.")

    @model_validator(mode="after")
    def _band(self) -> Self:
        if None not in (self.scale_out_above, self.scale_in_below) and self.scale_in_below >= self.scale_out_above:
            raise ValueError(f"scale_in_below ({self.scale_in_below:g}) must be below scale_out_above "
                             f"({self.scale_out_above:g}), or the fleet flaps")
        return self

    def vote(self, value: float) -> str:
        if self.scale_out_above is not None and value > self.scale_out_above:
            return "out"
        if self.scale_in_below is not None and value < self.scale_in_below:
            return "in"
        return "hold"


class BusyWhenLow(_Strict):
    """A signal that falls with load (fully-async queue depth, staleness: the trainer waits for rollouts)."""

    scale_out_at_most: float | None = Field(None, ge=0, description="Vote out when the value is at most this.")
    scale_in_at_least: float | None = Field(None, ge=0, description="Vote in when the value is at least this.")

    @model_validator(mode="after")
    def _band(self) -> Self:
        if None not in (self.scale_out_at_most, self.scale_in_at_least) and \
                self.scale_in_at_least <= self.scale_out_at_most:
            raise ValueError(f"scale_in_at_least ({self.scale_in_at_least:g}) must be above scale_out_at_most "
                             f"({self.scale_out_at_most:g}), or the fleet flaps")
        return self

    def vote(self, value: float) -> str:
        if self.scale_out_at_most is not None and value <= self.scale_out_at_most:
            return "out"
        if self.scale_in_at_least is not None and value >= self.scale_in_at_least:
            return "in"
        return "hold"


class Utilisation(BusyWhenHigh):
    """Requests in flight per engine (the router's counts), as a fraction of ``capacity``."""

    capacity: int = Field(32, ge=1, description="Requests in flight that make one engine fully used.")


class SignalsConfig(_Strict):
    """The thresholds of each signal; which signals a run has depends on its mode."""

    rollout_share: BusyWhenHigh = Field(
        default_factory=BusyWhenHigh,
        description="Colocate: rollout time / step time of the last step (perf/rollout_time_s / perf/step_time_s).")
    queue_depth: BusyWhenLow = Field(
        default_factory=BusyWhenLow,
        description="Fully-async: batches generated ahead and waiting for the trainer when a step starts "
                    "(0: the trainer waited for the rollout).")
    staleness: BusyWhenLow = Field(
        default_factory=BusyWhenLow,
        description="Fully-async: the last step's rollout/staleness_max (versions its samples lag the trainer).")
    utilisation: Utilisation = Field(
        default_factory=Utilisation,
        description="Any mode: mean requests in flight per engine over the polls since the last step, / capacity.")


class AutoscalerConfig(_Strict):
    """The autoscaler's settings: fleet bounds, step sizes, cooldowns, the polling interval and the signals."""

    min_engines: int = Field(1, ge=1, description="Never scale in below this many engines.")
    max_engines: int = Field(4, ge=1, description="Never scale out above this many engines.")
    scale_out_step: int = Field(1, ge=1, description="Engines one scale-out adds (fewer when max_engines is near).")
    scale_in_step: int = Field(1, ge=1, description="Engines one scale-in removes (fewer when min_engines is near).")
    scale_out_cooldown_s: float = Field(60.0, ge=0, description="After a scale-out, seconds before any next scale.")
    scale_in_cooldown_s: float = Field(120.0, ge=0, description="After a scale-in, seconds before any next scale.")
    poll_interval_s: float = Field(5.0, gt=0, description="Seconds between two reads of the signals.")
    signals: SignalsConfig = Field(default_factory=SignalsConfig, description="Per-signal thresholds.")

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.min_engines > self.max_engines:
            raise ValueError(f"min_engines ({self.min_engines}) is above max_engines ({self.max_engines})")
        return self



def problems(exc: ValidationError) -> list[str]:
    """One line per problem: the field's path in the file, then pydantic's message."""
    return [f"{field_path(e['loc'])}: {e['msg']}" for e in exc.errors()]


def parse(raw: object, source: str = "") -> AutoscalerConfig:
    """A parsed file's content as the config; ConfigError (one line per problem) when it does not fit."""
    try:
        return AutoscalerConfig.model_validate({} if raw is None else raw)
    except ValidationError as exc:
        lines = [f"{FLAG} {source}: {p}" if source else f"{FLAG}: {p}" for p in problems(exc)]
        raise (ConfigError(lines[0]) if len(lines) == 1 else ConfigErrors(lines)) from None


def load(path: str | Path) -> AutoscalerConfig:
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as exc:
        raise ConfigError(f"{FLAG} {path}: cannot read ({exc.strerror or exc})") from None
    import yaml

    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{FLAG} {path}: not YAML: {first}") from None
    return parse(raw, str(path))
