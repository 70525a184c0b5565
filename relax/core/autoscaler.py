"""The autoscaler loop (``--autoscaler-config PATH``): read the run's signals, scale its fleet within bounds.

Every ``poll_interval_s`` the loop gathers the signals (`StepSignals` from the last step's metrics, which the
runtime hands over in ``finish_step``; the router's in-flight counts, sampled at each poll), asks the pure
policy (relax/utils/autoscaler/policy.py) and carries a scale out through the run's own elastic fleet
(``Runtime.scale_out`` / ``Runtime.scale_in``, relax/core/elastic.py): a scale-in removes the newest engines.
The step signals are forgotten after a scale, so the next decision sees only steps the new fleet ran. The
cooldown runs from the end of a scale (a scale-out ends when its joiners serve).

Events (events.jsonl): ``autoscaler_start`` (the parsed config), ``autoscale_decision`` for every scale and for
a hold whose cause (``code``) differs from the previous decision's, with the reason, the signal values, the
votes, the fleet size and ``t`` (seconds on the loop's clock), and ``autoscale_result`` when a scale ends (the
fleet size after, or the one-line error). ``harness/checks/autoscale.py`` replays the policy over them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from relax.utils.autoscaler import config as autoscaler_config
from relax.utils.autoscaler.config import AutoscalerConfig
from relax.utils.autoscaler.policy import Action, Decision, LastScale, Signals, decide
from relax.utils.fault_hooks import autoscale_signals
from relax.utils.flag_slice import FlagSlice

STOP_WAIT_S = 5.0  # at shutdown, how long a poll in progress may take before the loop is left behind


@dataclass(frozen=True)
class AutoscalerFlags(FlagSlice):
    """The autoscaler's flag (a typed slice): the YAML file's path, parsed and checked when the slice is built."""

    autoscaler_config: str | None

    @property
    def enabled(self) -> bool:
        return self.autoscaler_config is not None

    def load(self) -> AutoscalerConfig | None:
        return autoscaler_config.load(self.autoscaler_config) if self.enabled else None

    def validate(self) -> None:
        self.load()


def step_signals(step: int, metrics: dict[str, Any]) -> Signals:
    """A step's signals from its metrics: fully-async steps have ``perf/queue_depth`` (and their staleness means
    something); colocate steps have the rollout's share of the step. Then the harness's synthetic overrides."""
    fully_async = "perf/queue_depth" in metrics
    values: dict[str, float | None] = {"queue_depth": None, "staleness": None, "rollout_share": None}
    if fully_async:
        values["queue_depth"] = float(metrics["perf/queue_depth"])
        values["staleness"] = _number(metrics.get("rollout/staleness_max"))
    elif metrics.get("perf/step_time_s"):
        values["rollout_share"] = float(metrics.get("perf/rollout_time_s", 0.0)) / float(metrics["perf/step_time_s"])
    values.update(autoscale_signals(step))
    return Signals(**{k: v for k, v in values.items() if k != "utilisation"})


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


class Fleet(Protocol):
    """What the loop needs of the run (a `RuntimeFleet` in a run, a fake in tests)."""

    def engines(self) -> list[int]: ...  # live engine indices
    def in_flight(self) -> list[int]: ...  # requests in flight per live engine (the router's counts)
    def scale_out(self, count: int) -> dict: ...
    def scale_in(self, indices: list[int]) -> dict: ...


class RuntimeFleet:
    def __init__(self, rt: Any):
        self.rt = rt

    def engines(self) -> list[int]:
        return [r.index for r in self.rt.fleet.live_records()]

    def in_flight(self) -> list[int]:
        router = self.rt.fleet.router
        return [router.outstanding(r.target.url) for r in self.rt.fleet.live_records()]

    def scale_out(self, count: int) -> dict:
        return self.rt.scale_out(count)

    def scale_in(self, indices: list[int]) -> dict:
        return self.rt.scale_in(indices)


class Autoscaler:
    def __init__(self, cfg: AutoscalerConfig, fleet: Fleet, event: Callable[..., None],
                 clock: Callable[[], float] = time.monotonic):
        self.cfg, self.fleet, self.event, self.clock = cfg, fleet, event, clock
        self.t0 = clock()
        self.last: LastScale | None = None
        self.last_code: str | None = None
        self._lock = threading.Lock()
        self._step: tuple[int, Signals] | None = None  # the last step's signals (None: none since the last scale)
        self._busy: list[float] = []  # utilisation samples since the last step
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def now(self) -> float:
        return self.clock() - self.t0

    # ------------------------------------------------------------------ inputs
    def observe_step(self, step: int, metrics: dict[str, Any]) -> None:
        """A step ended (the driver's thread): its signals replace the previous step's."""
        signals = step_signals(step, metrics)
        with self._lock:
            self._step, self._busy = (step, signals), []

    def _sample_utilisation(self) -> float | None:
        counts = self.fleet.in_flight()
        if not counts:
            return None
        with self._lock:
            self._busy.append(sum(counts) / len(counts) / self.cfg.signals.utilisation.capacity)
            return sum(self._busy) / len(self._busy)

    # ------------------------------------------------------------------ one poll
    def poll(self) -> Decision:
        utilisation = self._sample_utilisation()
        with self._lock:
            step, signals = self._step if self._step is not None else (None, Signals())
        signals = Signals(**{**signals.values(), "utilisation": utilisation})
        engines = self.fleet.engines()
        now = self.now()
        decision = decide(self.cfg, signals, len(engines), self.last, now)
        if decision.action is Action.HOLD and decision.code == self.last_code:
            return decision
        self.last_code = decision.code
        self.event("autoscale_decision", action=decision.action.value, count=decision.count, code=decision.code,
                   reason=decision.reason, signals=signals.values(), votes=decision.votes, engines=len(engines),
                   t=round(now, 3), step=step, last_scale=None if self.last is None else
                   {"action": self.last.action.value, "t": round(self.last.at, 3)})
        if decision.action is not Action.HOLD:
            self._scale(decision, engines)
        return decision

    def _scale(self, decision: Decision, engines: list[int]) -> None:
        fields: dict[str, Any] = {}
        try:
            if decision.action is Action.OUT:
                answer = self.fleet.scale_out(decision.count)
                fields = {"joined": answer.get("joined"), "removed": answer.get("removed")}
            else:
                leaving = sorted(engines)[-decision.count:]  # the newest engines leave
                answer = self.fleet.scale_in(leaving)
                fields = {"left": answer.get("left")}
        except Exception as exc:  # noqa: BLE001 - one line in events.jsonl; the run and the loop go on
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            fields = {"error": f"{type(exc).__name__}: {first}"[:300]}
        self.last = LastScale(decision.action, self.now())
        with self._lock:
            self._step, self._busy = None, []  # the next decision sees only what the new fleet did
        self.event("autoscale_result", action=decision.action.value, count=decision.count,
                   engines=len(self.fleet.engines()), t=round(self.last.at, 3), **fields)

    # ------------------------------------------------------------------ the thread
    def start(self) -> None:
        self.event("autoscaler_start", config=self.cfg.model_dump())
        self._thread = threading.Thread(target=self._run, name="relax-autoscaler", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.poll_interval_s):
            try:
                self.poll()
            except Exception as exc:  # noqa: BLE001 - a poll that fails (the run is ending) is reported, not fatal
                self.event("autoscale_error", error=f"{type(exc).__name__}: {exc}"[:300])

    def stop(self) -> None:
        """No poll after this; a scale in progress ends on its own timeouts (`FleetScaler.wait_idle`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=STOP_WAIT_S)
