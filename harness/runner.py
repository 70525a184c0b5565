"""Run one scenario: launch its runs through an executor, inject faults, evaluate checks."""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import relax
from harness.artifacts import RunArtifacts
from harness.checks import CheckContext
from harness.executors import Executor, Launch, Outcome
from harness.executors.base import tail
from harness.faults import FaultParams, FaultRecorder, FaultWatcher
from harness.machine_lock import machine_lock
from harness.placeholders import substitute
from harness.profiles import machine_class
from harness.results import SERIES_KEYS, RunResult, ScenarioResult
from harness.spec import RunSpec, ScenarioSpec

RELAX_TASKS = Path(relax.__file__).resolve().parent / "models" / "tasks"  # {relax_tasks} in scenario flags
RELAX_AUTOSCALER = Path(relax.__file__).resolve().parent / "utils" / "autoscaler"  # {relax_autoscaler}

UNSUPPORTED = re.compile(r"relax: (not supported yet: .+)")
EXIT_CONFIG = 2


@dataclass
class HarnessConfig:
    executor: Executor
    results_dir: Path = Path("harness-results")
    baselines_dir: Path | None = None
    root: Path = field(default_factory=lambda: Path(__file__).resolve().parents[1])
    require_baselines: bool = False
    machine_class: str | None = None  # None: detected per profile (harness.profiles.machine_class)
    lock_dir: Path | None = None  # the session's machine lock (timed scenarios run alone); None: no lock


def execute(executor: Executor, launch: Launch, faults: list[FaultParams], recorder: FaultRecorder,
            ) -> tuple[Outcome, FaultWatcher]:
    """One launch with its watched faults; always cleans up what it started."""
    t0 = time.monotonic()
    handle = executor.start(launch)
    watcher = FaultWatcher(launch.output_dir / "events.jsonl", faults, handle, recorder).start()
    timed_out = False
    try:
        code = handle.wait(launch.timeout_s)
        if code is None:
            timed_out = True
            handle.terminate(executor.grace_s)
            code = handle.poll()
    finally:
        watcher.stop()
        killed = handle.cleanup()
        # what the run left running when it ended (judged by the `interrupted` check): an artifact like the rest
        recorder.record(event="launch_cleanup", fault=False, killed_pids=killed, exit_code=handle.poll())
    return Outcome(exit_code=code, timed_out=timed_out, duration_s=time.monotonic() - t0,
                   log_tail=tail(launch.log_path), killed_pids=killed, details=handle.details()), watcher


def _run_one(spec: ScenarioSpec, run: RunSpec, cfg: HarnessConfig, scenario_dir: Path) -> RunResult:
    out = scenario_dir / run.name
    out.mkdir(parents=True, exist_ok=True)
    recorder = FaultRecorder(out / "events.jsonl")
    faults = spec.faults_for(run.name)
    values = {"output_dir": str(out), "scenario_dir": str(scenario_dir), "relax_tasks": str(RELAX_TASKS),
              "relax_autoscaler": str(RELAX_AUTOSCALER)}
    values |= {f"run:{r.name}": str(scenario_dir / r.name) for r in spec.runs}
    env = {**spec.env, **run.env}
    result = RunResult(name=run.name, expect_exit=run.expect_exit, phase_exits=run.phase_exits,
                       planned_launches=len(run.launches(spec.engine_flags)), output_dir=str(out),
                       log_path=str(out / "run.log"))
    started: list = []  # in order; a fault's fields may name what an earlier one started ({server:NAME})
    try:
        for fault in faults:
            fault = fault.resolve(values)
            started.append(fault)
            values |= fault.start(recorder)
            env |= fault.env()
        launches = run.launches(spec.engine_flags)
        for i, flags in enumerate(launches):
            launch = Launch(scenario=spec.name, run=run.name, argv=substitute(flags, values), output_dir=out,
                            work_dir=scenario_dir, log_path=out / "run.log", env=env, resources=spec.resources,
                            timeout_s=spec.timeout_s, profile=spec.profile, image=spec.image)
            # faults fire in the first launch only (a resume phase must not be killed again)
            outcome, watcher = execute(cfg.executor, launch, started if i == 0 else [], recorder)
            result.launches = i + 1
            result.exit_code, result.timed_out = outcome.exit_code, outcome.timed_out
            result.duration_s += outcome.duration_s
            result.log_tail = outcome.log_tail
            result.killed_pids += outcome.killed_pids
            result.details = outcome.details
            if i == 0:
                result.fault_errors += watcher.errors + [f"fault never fired: {u}" for u in watcher.unfired()]
            found = UNSUPPORTED.search(outcome.log_tail)
            if outcome.exit_code == EXIT_CONFIG and found:
                result.unsupported = found.group(1).strip()
            result.phase_exit_codes.append(outcome.exit_code)
            last_phase = i == len(launches) - 1
            if outcome.timed_out or (not last_phase and outcome.exit_code != run.phase_exit(i)):
                break
    finally:
        stats = [fault.stop() for fault in reversed(started)]  # a proxy before the server behind it
        if any(stats):
            result.details["fault_stats"] = [s for s in stats if s]
    result.faults = recorder.records
    return result


def _problems(runs: list[RunResult], spec: ScenarioSpec) -> list[str]:
    problems = []
    for r in runs:
        if r.timed_out:
            problems.append(f"run {r.name} timed out after {spec.timeout_s:g}s (process group killed)")
        elif r.phase_problem():
            problems.append(f"run {r.name}: {r.phase_problem()}")
        elif r.expect_exit is not None and r.exit_code != r.expect_exit:
            last = [ln for ln in r.log_tail.splitlines() if ln.startswith("relax:")][-1:] or r.log_tail.splitlines()[-1:]
            problems.append(f"run {r.name} exited {r.exit_code} (expected {r.expect_exit})"
                            + (f": {last[0].strip()}" if last else ""))
        problems += [f"run {r.name}: {e}" for e in r.fault_errors]
    return problems


def evaluate(spec: ScenarioSpec, runs: dict[str, RunArtifacts], cfg: HarnessConfig, machine: str):
    ctx = CheckContext(runs=runs, profile=spec.profile, baselines_dir=cfg.baselines_dir,
                       baseline_key=spec.baseline_key or spec.name, machine_class=machine,
                       require_baselines=cfg.require_baselines, spec_digest=spec.digest(), root=cfg.root)
    return [c.run_check(ctx) for c in spec.checks]


def run_scenario(spec: ScenarioSpec, cfg: HarnessConfig) -> ScenarioResult:
    scenario_dir = (cfg.results_dir / "runs" / spec.name).resolve()
    shutil.rmtree(scenario_dir, ignore_errors=True)
    scenario_dir.mkdir(parents=True)
    machine = cfg.machine_class or machine_class(spec.profile)
    with machine_lock(cfg.lock_dir, exclusive=spec.measures_throughput):
        started, t0 = time.time(), time.monotonic()
        runs = [_run_one(spec, r, cfg, scenario_dir) for r in spec.runs]
    res = ScenarioResult(name=spec.name, family=spec.family, profile=spec.profile.value,
                         executor=cfg.executor.name, runs=runs, baseline_key=spec.baseline_key or spec.name,
                         machine_class=machine, started=started)
    unsupported = [r.unsupported for r in runs if r.unsupported]
    artifacts = {r.name: RunArtifacts.load(r.output_dir) for r in runs}
    res.series = {name: {k: [[s, v] for s, v in a.metric_series(k).items()] for k in SERIES_KEYS}
                  for name, a in artifacts.items()}
    if unsupported:
        res.status, res.message = "unsupported", f"engine: {unsupported[0]}"
        res.problems = [res.message]
    else:
        res.problems = _problems(runs, spec)
        res.checks = evaluate(spec, artifacts, cfg, machine)
        failures = res.failures()
        res.status = "failed" if failures else "passed"
        res.message = failures[0] if failures else res.pass_message()
    res.duration_s = time.monotonic() - t0
    return res
