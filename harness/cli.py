"""``relax-harness`` / ``python -m harness``: run | list | report | baseline update | gate."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from harness.executors import EXECUTORS, make_executor
from harness.results import load_results, scenario_results, write_results

REPO = Path(__file__).resolve().parents[1]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relax-harness", description="relax scenario harness")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run scenarios by name (or --family / --all) and write results")
    run.add_argument("names", nargs="*")
    run.add_argument("--all", action="store_true")
    run.add_argument("--family", action="append", default=[])
    run.add_argument("--executor", default="local", choices=EXECUTORS.names())
    run.add_argument("--results", default="harness-results")
    run.add_argument("--baselines", default=str(REPO / "ci" / "baselines"))
    run.add_argument("--specs", default=None)
    run.add_argument("--engine-cmd", default=None, help="engine command instead of `python -m relax.cli train`")
    run.add_argument("--image", default=None)
    run.add_argument("--update-baselines", action="store_true")

    ls = sub.add_parser("list", help="list scenarios in the catalog")
    ls.add_argument("--specs", default=None)
    ls.add_argument("--family", default=None)

    rep = sub.add_parser("report", help="render report.html and a terminal summary from a results JSON")
    rep.add_argument("results")
    rep.add_argument("--html", default=None, help="output path (default: next to the results)")

    base = sub.add_parser("baseline", help="baselines (updated only by this explicit command)")
    bsub = base.add_subparsers(dest="baseline_command", required=True)
    upd = bsub.add_parser("update", help="write the throughput measured in RESULTS into the baselines")
    upd.add_argument("results")
    upd.add_argument("--baselines", default=str(REPO / "ci" / "baselines"))

    gate = sub.add_parser("gate", help="CI gate: results + baselines -> pass/fail and a markdown summary")
    gate.add_argument("results")
    gate.add_argument("--baselines", default=str(REPO / "ci" / "baselines"))
    gate.add_argument("--summary", default=None)
    gate.add_argument("--require-baselines", action="store_true")
    return p


def cmd_list(args: argparse.Namespace) -> int:
    from harness.spec import load_catalog

    for name, spec in load_catalog(args.specs).items():
        if args.family and spec.family != args.family:
            continue
        checks = ",".join(c.kind for c in spec.checks)
        print(f"{name:<34} {spec.family:<16} {spec.profile.value:<4} {len(spec.runs)} run(s)  checks: {checks}")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from harness.report import render_summary, write_html
    from harness.runner import HarnessConfig, run_scenario
    from harness.spec import load_catalog

    catalog = load_catalog(args.specs)
    names = list(args.names)
    if args.all:
        names = list(catalog)
    names += [n for n, s in catalog.items() if s.family in args.family and n not in names]
    unknown = [n for n in names if n not in catalog]
    if unknown or not names:
        print(f"relax-harness: unknown or no scenarios {unknown}; see `relax-harness list`", file=sys.stderr)
        return 2
    kwargs = {"engine_cmd": shlex.split(args.engine_cmd) if args.engine_cmd else None}
    if args.executor == "docker":
        kwargs["image"] = args.image
    executor = make_executor(args.executor, **kwargs)
    cfg = HarnessConfig(executor=executor, results_dir=Path(args.results).resolve(),
                        baselines_dir=Path(args.baselines), update_baselines=args.update_baselines)
    results = []
    for name in names:
        spec = catalog[name]
        reason = executor.unavailable(spec.profile)
        if reason:
            print(f"relax-harness: {name}: cannot run here: {reason}", file=sys.stderr)
            return 2
        print(f"running {name} ...", flush=True)
        results.append(run_scenario(spec, cfg))
        print(results[-1].summary(), flush=True)
    path = write_results(cfg.results_dir / "results.json", results, executor=args.executor)
    data = load_results(path)
    write_html(data, cfg.results_dir / "report.html")
    print(render_summary(data["scenarios"]))
    print(f"results: {path}")
    return 0 if all(r.passed for r in results) else 1


def cmd_report(args: argparse.Namespace) -> int:
    from harness.report import render_summary, write_html

    data = load_results(Path(args.results))
    out = Path(args.html) if args.html else Path(args.results).with_name("report.html")
    write_html(data, out)
    print(render_summary(data.get("scenarios", [])))
    print(f"report: {out}")
    return 0 if all(s.passed for s in scenario_results(data)) else 1


def cmd_baseline(args: argparse.Namespace) -> int:
    from harness.baselines import update_from_results

    written = update_from_results(load_results(Path(args.results)), Path(args.baselines))
    for path in written:
        print(f"updated {path}")
    if not written:
        print("no throughput measurements in the results; nothing updated", file=sys.stderr)
        return 1
    return 0


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate import main as gate_main

    argv = [args.results, "--baselines", args.baselines]
    argv += ["--summary", args.summary] if args.summary else []
    argv += ["--require-baselines"] if args.require_baselines else []
    return gate_main(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"run": cmd_run, "list": cmd_list, "report": cmd_report, "baseline": cmd_baseline, "gate": cmd_gate}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
