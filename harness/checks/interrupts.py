"""Interrupted: a run told to stop by a signal stopped cleanly, and (optionally) a resume carried it on.

Read from events.jsonl, which every launch of a run appends to (run.json is the last launch's):

- the first ``run_end`` is the interrupted launch's: status ``interrupted``, the signal and the exit code
  128 + signal, within ``within_s`` of the first signal the harness sent (``fault_injected``);
- every launch left no process running (the harness's ``launch_cleanup`` events list what it had to kill);
- with ``resumed``: a later launch resumed (``resume``) at the step after the last checkpoint saved before the
  interruption, ended ``completed``, and metrics.jsonl holds every step of the run: none was lost.
"""

from __future__ import annotations

import signal
from typing import Literal

from harness.checks.base import CheckContext, CheckParams, CheckResult, register


@register("interrupted")
class InterruptedCheck(CheckParams):
    kind: Literal["interrupted"] = "interrupted"
    run: str | None = None
    signal: Literal["SIGINT", "SIGTERM"]
    within_s: float = 30.0
    resumed: bool = False
    steps: int | None = None  # with resumed: the run's total steps (0 .. steps-1 must all be in metrics.jsonl)

    def evaluate(self, ctx: CheckContext) -> CheckResult:
        run = ctx.run(self.run)
        ends = run.events_named("run_end")
        sent = [e for e in run.events_named("fault_injected") if e.get("signal") == self.signal]
        problems: list[str] = []
        if not sent:
            return self.result(False, f"no {self.signal} was sent (no fault_injected event): the fault never fired")
        if not ends:
            return self.result(False, "no run_end event: the interrupted launch did not record its end")
        end, code = ends[0], 128 + signal.Signals[self.signal].value
        if (end.get("status"), end.get("signal"), end.get("exit_code")) != ("interrupted", self.signal, code):
            problems.append(f"the first run_end is status {end.get('status')!r}, signal {end.get('signal')!r}, "
                            f"exit {end.get('exit_code')} (expected interrupted, {self.signal}, {code})")
        took = float(end.get("time", 0)) - float(sent[0].get("time", 0))
        if took > self.within_s:
            problems.append(f"it ended {took:.1f} s after the first {self.signal} (bound {self.within_s:g} s)")
        leftovers = [pid for e in run.events_named("launch_cleanup") for pid in e.get("killed_pids") or []]
        if leftovers:
            problems.append(f"processes left running after a launch ended (killed by the harness): {leftovers}")
        if self.resumed:
            problems += self._resume_problems(run, end)
        details = {"ended_after_s": round(took, 3), "run_ends": len(ends), "leftovers": leftovers}
        if problems:
            return self.result(False, "; ".join(problems), details=details)
        return self.result(True, f"{self.signal}: interrupted and recorded {took:.1f} s after the signal, exit {code}, "
                                 f"nothing left running" + (", resumed to the end" if self.resumed else ""),
                           details=details, measurements={"ended_after_s": took})

    def _resume_problems(self, run, interrupted_end: dict) -> list[str]:
        cut = float(interrupted_end.get("time", 0))
        saved = [int(e["step"]) for e in run.events_named("checkpoint_saved") if float(e.get("time", 0)) <= cut]
        resumes = [e for e in run.events_named("resume") if float(e.get("time", 0)) > cut]
        ends = run.events_named("run_end")
        problems = []
        if not resumes:
            return ["no resume event after the interruption"]
        expected = (max(saved) + 1) if saved else 0
        if int(resumes[0].get("step", -1)) != expected:
            problems.append(f"resumed at step {resumes[0].get('step')}, expected {expected} (the step after the last "
                            f"checkpoint saved before the interruption: {max(saved) if saved else 'none'})")
        if ends[-1].get("status") != "completed":
            problems.append(f"the resumed launch ended {ends[-1].get('status')!r}")
        if self.steps is not None:
            missing = sorted(set(range(self.steps)) - set(run.steps()))
            if missing:
                problems.append(f"steps never recorded in metrics.jsonl: {missing}")
        return problems
