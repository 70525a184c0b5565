"""``relax-harness baseline record``: throughput baselines of this machine class, from N fresh runs.

Each named scenario (default: every scenario of the profile with a throughput check) runs ``--runs`` times
in a row, each run a separate launch of the engine (its own Ray cluster, model build and warm-up), so the
spread covers what differs between launches, not only between steps. Every run must pass its other checks.
``--from RESULTS_JSON ...`` records from runs made elsewhere instead (e.g. a GPU session's results).
"""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any

from harness import baselines
from harness.commit import source_commit
from harness.executors.local import LocalExecutor
from harness.profiles import Profile, cuda_available, machine_class
from harness.results import ScenarioResult, load_results, write_results
from harness.runner import HarnessConfig, run_scenario
from harness.spec import ScenarioSpec, load_catalog


class RecordError(RuntimeError):
    pass


def select(catalog: dict[str, ScenarioSpec], names: list[str], profile: Profile) -> list[ScenarioSpec]:
    if not names:
        specs = [s for s in catalog.values() if s.profile is profile and s.measures_throughput]
        if not specs:
            raise RecordError(f"no {profile.value} scenario has a throughput check")
        return specs
    unknown = [n for n in names if n not in catalog]
    if unknown:
        raise RecordError(f"unknown scenarios {unknown}; see `relax-harness list`")
    plain = [n for n in names if not catalog[n].measures_throughput]
    if plain:
        raise RecordError(f"{', '.join(plain)}: no throughput check, nothing to record")
    return [catalog[n] for n in names]


def run_for_baseline(spec: ScenarioSpec, runs: int, results_dir: Path, engine_cmd: list[str] | None,
                     log=print) -> list[ScenarioResult]:
    """``runs`` passing runs of ``spec``, in a row (a failing run stops the recording: it is no baseline)."""
    out = []
    for i in range(1, runs + 1):
        cfg = HarnessConfig(executor=LocalExecutor(engine_cmd), results_dir=results_dir / f"{spec.name}-{i}")
        res = run_scenario(spec, cfg)
        res.name = f"{spec.name}[run {i}]"
        out.append(res)
        if res.failures():
            raise RecordError(f"{spec.name} run {i} failed, so it cannot be a baseline: {res.failures()[0]}")
        value = next(c.measurements["value"] for c in res.checks if c.kind == "throughput")
        log(f"  {spec.name} run {i}/{runs}: {value:.4g} ({res.duration_s:.1f} s)")
    return out


def _store(data: list[dict[str, Any]], directory: Path, keys: list[str] | None) -> tuple[str, dict, Path]:
    try:
        machine, measured = baselines.measurements_from_results(data)
        if keys:
            measured = {k: v for k, v in measured.items() if k in keys}
        path = baselines.record(directory, machine, measured, source_commit())
    except ValueError as exc:
        raise RecordError(str(exc)) from None
    return machine, measured, path


def record_baselines(args: Namespace, log=print) -> tuple[Path, str]:
    """Record from ``--from`` results, or run each scenario ``--runs`` times and store its baseline as soon as
    its runs are done (a session cut short keeps the scenarios it finished); every run lands in
    ``--results``/results.json."""
    if args.runs < baselines.MIN_RUNS:
        raise RecordError(f"--runs {args.runs}: a baseline needs at least {baselines.MIN_RUNS} runs")
    directory = Path(args.baselines)
    if args.from_results:
        machine, measured, path = _store([load_results(Path(p)) for p in args.from_results], directory, args.names)
        return path, summary(machine, measured, baselines.load(directory, machine) or {})
    profile = Profile(args.profile)
    if profile is Profile.GPU and not cuda_available():
        raise RecordError("--profile gpu: no CUDA device here; record GPU baselines on the GPU machine")
    specs = select(load_catalog(args.specs), list(args.names), profile)
    engine_cmd = args.engine_cmd.split() if args.engine_cmd else None
    results_dir = Path(args.results).resolve()
    log(f"recording {', '.join(s.name for s in specs)} on {machine_class(profile)}: {args.runs} runs each")
    results: list[ScenarioResult] = []
    recorded: dict[str, list[dict[str, Any]]] = {}
    for spec in specs:
        results += run_for_baseline(spec, args.runs, results_dir, engine_cmd, log)
        written = write_results(results_dir / "results.json", results)
        machine, measured, path = _store([load_results(written)], directory, [spec.baseline_key or spec.name])
        recorded |= measured
        log(f"  stored {spec.name} in {path}")
    return path, summary(machine, recorded, baselines.load(directory, machine) or {})


def summary(machine: str, measured: dict[str, list[dict[str, Any]]], stored: dict[str, Any]) -> str:
    lines = [f"baselines for {machine}:"]
    for key in measured:
        e = stored["scenarios"][key]
        values = ", ".join(f"{v:.4g}" for v in e["values"])
        lines.append(f"  {key}: median {e['median']:.4g} {e['metric']} (runs: {values}; relative spread "
                     f"{e['spread']:.1%}, tolerance from the spread {e['tolerance']:.1%})")
    return "\n".join(lines)
