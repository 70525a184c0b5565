"""Elastic-fleet schedule: scale a running job through its control endpoint (``--fleet-control-addr``).

``{kind: scale, action: out, count: 2, at: {step: 3}}`` posts ``/scale_out`` once the trigger matches;
``{kind: scale, action: in, indices: [1, 2], at: {step: 4, phase: rollout}}`` posts ``/scale_in``. The
endpoint's address is the run's ``control_endpoint`` event. The request runs in its own thread (a scale-out
waits for the engines to start), and its answer is a ``scale_answered`` event. ``engine_unhealthy`` plants an
engine that starts but never generates (``RELAX_FAULT_ENGINE_UNHEALTHY``, relax/utils/fault_hooks.py);
``autoscale_load`` imposes the autoscaler's signal values step by step (``RELAX_FAULT_AUTOSCALE_SIGNALS``).
"""

from __future__ import annotations

import json
import threading
import urllib.request
from typing import Any, Literal

from harness.faults.base import FaultParams, FaultRecorder, SignalTarget, Trigger, register
from harness.faults.watcher import EventTail

REQUEST_TIMEOUT_S = 600.0  # a scale-out answers within --scale-out-timeout; this only bounds a hung run


def control_url(recorder: FaultRecorder) -> str | None:
    for ev in EventTail(recorder.events_path).read_new():
        if ev.get("event") == "control_endpoint" and ev.get("url"):
            return str(ev["url"])
    return None


@register("scale")
class ScaleFault(FaultParams):
    kind: Literal["scale"] = "scale"
    action: Literal["out", "in"]
    count: int = 1  # out: how many engines join
    indices: list[int] = []  # in: which engines leave
    at: Trigger = Trigger()
    api_key: str | None = None

    @property
    def trigger_spec(self) -> Trigger:
        return self.at

    @property
    def role(self) -> str:
        return "driver"

    def fire(self, target: SignalTarget, pid: int | None, recorder: FaultRecorder, ev: dict[str, Any]) -> None:
        url = control_url(recorder)
        if url is None:
            raise OSError("no control_endpoint event: run with --fleet-control-addr")
        path, body = ("/scale_out", {"count": self.count}) if self.action == "out" else ("/scale_in",
                                                                                        {"indices": self.indices})
        recorder.record(kind=self.kind, action=self.action, url=url + path, body=body, step=ev.get("step"),
                        trigger=self.at.describe())
        threading.Thread(target=self._post, args=(url + path, body, recorder), daemon=True,
                         name=f"harness-scale-{self.action}").start()

    def _post(self, url: str, body: dict, recorder: FaultRecorder) -> None:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_S) as resp:
                status, answer = resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            status, answer = exc.code, exc.read().decode(errors="replace")[:500]
        except OSError as exc:
            status, answer = None, f"{type(exc).__name__}: {exc}"
        recorder.record(event="scale_answered", fault=False, action=self.action, status=status, answer=answer)


@register("engine_unhealthy")
class EngineUnhealthyFault(FaultParams):
    """Engines ``engines`` (indices; joiners of a scale-out) start but never pass ``/health_generate``."""

    kind: Literal["engine_unhealthy"] = "engine_unhealthy"
    engines: list[int]

    def env(self) -> dict[str, str]:
        return {"RELAX_FAULT_ENGINE_UNHEALTHY": ",".join(str(i) for i in self.engines)}

    def start(self, recorder: FaultRecorder) -> dict[str, str]:
        recorder.record(kind=self.kind, engines=self.engines, armed=True, env=self.env())
        return {}


@register("autoscale_load")
class AutoscaleLoadFault(FaultParams):
    """A synthetic load for the autoscaler (``--autoscaler-config``): from each named step on, the signals the
    run's autoscaler reads are these values instead of the measured ones (``RELAX_FAULT_AUTOSCALE_SIGNALS``,
    relax/utils/fault_hooks.py). ``{kind: autoscale_load, schedule: {0: {rollout_share: 0.95}, 6:
    {rollout_share: 0.05}}}``: a load that rises, then falls at step 6. Signals not named keep their values."""

    kind: Literal["autoscale_load"] = "autoscale_load"
    schedule: dict[int, dict[Literal["rollout_share", "queue_depth", "staleness"], float]]

    def env(self) -> dict[str, str]:
        return {"RELAX_FAULT_AUTOSCALE_SIGNALS": json.dumps({str(k): v for k, v in self.schedule.items()})}

    def start(self, recorder: FaultRecorder) -> dict[str, str]:
        recorder.record(kind=self.kind, schedule={str(k): v for k, v in self.schedule.items()}, armed=True,
                        env=self.env())
        return {}
