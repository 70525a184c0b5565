"""The autoscaler's policy: signals in, a decision (with its reason) out. Pure: no clock, no fleet.

* Each signal votes out / in / hold against its thresholds (relax/utils/autoscaler/config.py); a signal with
  no value (``None``: not measured in this run mode, or not since the last scale) abstains.
* A fleet outside ``[min_engines, max_engines]`` is brought back inside first, whatever the votes.
* Otherwise: out when any signal votes out, by ``scale_out_step`` engines but never past ``max_engines``; in
  when every signal that has a value votes in, by ``scale_in_step`` but never below ``min_engines``.
* A scale waits out the cooldown of the previous one (``scale_out_cooldown_s`` after a scale-out,
  ``scale_in_cooldown_s`` after a scale-in): two scales are never closer than the first one's cooldown.

A hold carries a ``code`` (``cooldown``, ``at_max``, ``at_min``, ``in_band``, ``no_signal``) so the loop can
report a hold only when its cause changes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from enum import StrEnum

from relax.utils.autoscaler.config import AutoscalerConfig


class Action(StrEnum):
    OUT = "out"
    IN = "in"
    HOLD = "hold"


@dataclass(frozen=True)
class Signals:
    """What the run measured; ``None``: not measured (this mode has no such signal, or no step since)."""

    rollout_share: float | None = None
    queue_depth: float | None = None
    staleness: float | None = None
    utilisation: float | None = None

    def values(self) -> dict[str, float | None]:
        return asdict(self)


@dataclass(frozen=True)
class LastScale:
    action: Action  # OUT or IN
    at: float  # seconds, on the loop's clock


@dataclass(frozen=True)
class Decision:
    action: Action
    count: int  # engines to add (OUT) or remove (IN); 0 for HOLD
    code: str  # why: "signals", "below_min", "above_max", or a hold's cause
    reason: str  # one line for people
    votes: dict[str, str] = field(default_factory=dict)


def votes(cfg: AutoscalerConfig, signals: Signals) -> dict[str, str]:
    """Each signal that has a value and at least one threshold: its vote."""
    out = {}
    for name, value in signals.values().items():
        band = getattr(cfg.signals, name)
        thresholds = [v for k, v in band.model_dump().items() if k.startswith("scale_")]
        if value is not None and any(t is not None for t in thresholds):
            out[name] = band.vote(value)
    return out


def cooldown_left(cfg: AutoscalerConfig, last: LastScale | None, now: float) -> float:
    if last is None:
        return 0.0
    cooldown = cfg.scale_out_cooldown_s if last.action is Action.OUT else cfg.scale_in_cooldown_s
    return max(0.0, cooldown - (now - last.at))  # as the elapsed time is compared: no rounding between them


def decide(cfg: AutoscalerConfig, signals: Signals, engines: int, last: LastScale | None, now: float) -> Decision:
    """The decision for a fleet of ``engines`` at time ``now``, the previous scale being ``last``."""
    v = votes(cfg, signals)
    shown = ", ".join(f"{k}={signals.values()[k]:g} votes {v[k]}" for k in v) or "no signal"
    if engines < cfg.min_engines:
        want = Decision(Action.OUT, cfg.min_engines - engines, "below_min",
                        f"{engines} engines, below min_engines {cfg.min_engines}", v)
    elif engines > cfg.max_engines:
        want = Decision(Action.IN, engines - cfg.max_engines, "above_max",
                        f"{engines} engines, above max_engines {cfg.max_engines}", v)
    elif not v:
        return Decision(Action.HOLD, 0, "no_signal", "no signal has a value yet", v)
    elif "out" in v.values():
        count = min(cfg.scale_out_step, cfg.max_engines - engines)
        if count == 0:
            return Decision(Action.HOLD, 0, "at_max", f"{shown}; already at max_engines {cfg.max_engines}", v)
        want = Decision(Action.OUT, count, "signals", shown, v)
    elif all(x == "in" for x in v.values()):
        count = min(cfg.scale_in_step, engines - cfg.min_engines)
        if count == 0:
            return Decision(Action.HOLD, 0, "at_min", f"{shown}; already at min_engines {cfg.min_engines}", v)
        want = Decision(Action.IN, count, "signals", shown, v)
    else:
        return Decision(Action.HOLD, 0, "in_band", shown, v)
    left = cooldown_left(cfg, last, now)
    if left > 0:
        return Decision(Action.HOLD, 0, "cooldown", f"{want.action} {want.count} wanted ({want.reason}); "
                                                    f"{left:.1f} s of the last scale-{last.action}'s cooldown left", v)
    return want
