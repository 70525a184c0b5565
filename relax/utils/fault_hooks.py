"""Fault-injection hooks for the scenario harness (``RELAX_FAULT_<NAME>_AT_STEP=<step>``).

Faults that cannot be injected from outside a process (a reward function raising, a NaN
loss, a failing checkpoint write, a trainer that drops a sample) are triggered here when the
harness sets the matching environment variable; Ray workers inherit every ``RELAX_*`` variable.
Unset, they cost a dictionary lookup and change nothing.

`EngineHooks` plants defects in the rollout engine's decode loop, for the harness's own tests:
a slowdown (each engine step sleeps a fraction of its own duration more, the A/B gate's planted
regression) and a KV-cache decode bug (generated positions from N on report a skewed log-prob,
which only a check over every response token catches). The engine reads them once, at start-up.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass

HOOKS = ("REWARD_RAISE", "NAN_LOSS", "CKPT_WRITE_FAIL", "TRAINER_DROP_SAMPLE")

ENGINE_SLOWDOWN_ENV = "RELAX_FAULT_ENGINE_SLOWDOWN"  # fraction: 0.3 makes every engine step 1.3x as long
DECODE_SKEW_ENV = "RELAX_FAULT_DECODE_LOGPROB_SKEW_FROM"  # generated position (0-based) the skew starts at
DECODE_SKEW = 1e-3  # added to the reported log-prob of every skewed position
CKPT_WRITE_DELAY_ENV = "RELAX_FAULT_CKPT_WRITE_DELAY_S"  # seconds a trainer's checkpoint save takes longer
ENGINE_UNHEALTHY_ENV = "RELAX_FAULT_ENGINE_UNHEALTHY"  # engine indices (comma-separated) whose /health_generate fails
AUTOSCALE_SIGNALS_ENV = "RELAX_FAULT_AUTOSCALE_SIGNALS"  # JSON {"<from step>": {"<signal>": value}}: a synthetic load


def fault_at(name: str, step: int) -> bool:
    if name not in HOOKS:
        raise ValueError(f"unknown fault hook {name!r}; known: {', '.join(HOOKS)}")
    value = os.environ.get(f"RELAX_FAULT_{name}_AT_STEP")
    return value is not None and value.strip() == str(step)


def _env_number(name: str, kind: type, minimum: float) -> float | int | None:
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    try:
        value = kind(raw)
    except ValueError:
        raise ValueError(f"{name}={raw!r}: expected a {kind.__name__} >= {minimum}") from None
    if value < minimum:
        raise ValueError(f"{name}={raw!r}: expected a {kind.__name__} >= {minimum}")
    return value


def autoscale_signals(step: int) -> dict[str, float]:
    """The autoscaler's signal values the harness imposes from step ``step`` on (a synthetic load that rises and
    falls, for the autoscale-policy scenario): ``RELAX_FAULT_AUTOSCALE_SIGNALS='{"0": {"rollout_share": 0.95},
    "6": {"rollout_share": 0.05}}'`` sets the rollout share to 0.95 for steps 0-5 and 0.05 from step 6 on; the
    signals a schedule does not name keep their measured values. Empty when unset."""
    raw = os.environ.get(AUTOSCALE_SIGNALS_ENV, "")
    if not raw.strip():
        return {}
    try:
        schedule = {int(k): {str(n): float(v) for n, v in values.items()} for k, values in json.loads(raw).items()}
    except (ValueError, AttributeError, TypeError):
        raise ValueError(f"{AUTOSCALE_SIGNALS_ENV}={raw!r}: expected JSON {{\"<step>\": {{\"<signal>\": number}}}}") from None
    started = [k for k in schedule if k <= step]
    return schedule[max(started)] if started else {}


def engine_unhealthy(index: int) -> bool:
    """Whether embedded engine ``index`` plays an engine that starts but never generates: its ``/health_generate``
    answers 503 (a scale-out's joiner that never becomes healthy, for the elastic-fleet scenarios)."""
    raw = os.environ.get(ENGINE_UNHEALTHY_ENV, "")
    try:
        return index in {int(v) for v in raw.split(",") if v.strip()}
    except ValueError:
        raise ValueError(f"{ENGINE_UNHEALTHY_ENV}={raw!r}: expected comma-separated engine indices") from None


def checkpoint_write_delay() -> float:
    """Seconds the trainer waits inside each checkpoint save, its files written but not yet published (a slow
    disk: a signal or a failure can land mid-save)."""
    return float(_env_number(CKPT_WRITE_DELAY_ENV, float, 0.0) or 0.0)


@dataclass(frozen=True)
class EngineHooks:
    """Planted engine defects (see the module docstring); both off unless their variable is set."""

    slowdown: float = 0.0
    skew_from: int | None = None

    @classmethod
    def from_env(cls) -> EngineHooks:
        return cls(slowdown=float(_env_number(ENGINE_SLOWDOWN_ENV, float, 0.0) or 0.0),
                   skew_from=_env_number(DECODE_SKEW_ENV, int, 0))

    def after_step(self, started: float) -> None:
        """End of one engine step that began at ``started`` (``time.perf_counter()``)."""
        if self.slowdown:
            time.sleep(self.slowdown * (time.perf_counter() - started))

    def logprob(self, value: float, generated: int) -> float:
        """The log-prob reported for the ``generated``-th token of a response (1-based count)."""
        if self.skew_from is not None and generated - 1 >= self.skew_from:
            return value + DECODE_SKEW
        return value
