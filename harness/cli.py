"""``relax-harness`` / ``python -m harness``: run | list | report | baseline record | ab | gate."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

from harness.executors import EXECUTORS, make_executor
from harness.profiles import Profile
from harness.results import ResultsError, load_results, scenario_results, write_results
from harness.spec import SpecError

REPO = Path(__file__).resolve().parents[1]
BASELINES = REPO / "ci" / "baselines"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="relax-harness", description="relax scenario harness")
    sub = p.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run scenarios by name (or --family / --all) and write results")
    run.add_argument("names", nargs="*")
    run.add_argument("--all", action="store_true")
    run.add_argument("--family", action="append", default=[])
    run.add_argument("--executor", default="local", choices=EXECUTORS.names())
    run.add_argument("--results", default="harness-results")
    run.add_argument("--baselines", default=str(BASELINES))
    run.add_argument("--require-baselines", action="store_true", help="a missing throughput baseline fails")
    run.add_argument("--specs", default=None)
    run.add_argument("--engine-cmd", default=None, help="engine command instead of `python -m relax.cli train`")
    run.add_argument("--image", default=None)

    ls = sub.add_parser("list", help="list scenarios in the catalog")
    ls.add_argument("--specs", default=None)
    ls.add_argument("--family", default=None)

    rep = sub.add_parser("report", help="render report.html and a terminal summary from a results JSON")
    rep.add_argument("results")
    rep.add_argument("--html", default=None, help="output path (default: next to the results)")

    base = sub.add_parser("baseline", help="throughput baselines of this machine class (only this command writes them)")
    bsub = base.add_subparsers(dest="baseline_command", required=True)
    rec = bsub.add_parser("record", help="record baselines from N runs of each throughput scenario (or from results)")
    rec.add_argument("names", nargs="*", help="scenarios (default: every one of --profile with a throughput check)")
    rec.add_argument("--profile", default="cpu", choices=[p.value for p in Profile])
    rec.add_argument("--runs", type=int, default=5, help="runs per scenario (at least 5)")
    rec.add_argument("--from", dest="from_results", nargs="+", default=None, metavar="RESULTS_JSON",
                     help="take the measurements from these results files instead of running")
    rec.add_argument("--baselines", default=str(BASELINES))
    rec.add_argument("--results", default="harness-results/baselines", help="where the recording runs go")
    rec.add_argument("--specs", default=None)
    rec.add_argument("--engine-cmd", default=None)

    ab = sub.add_parser("ab", help="A/B throughput gate: this checkout against a base commit, on this machine")
    ab.add_argument("--base", required=True, help="git ref of the base (e.g. origin/main, HEAD~1)")
    ab.add_argument("--scenario", default="colocate-cpu", help="a scenario with a throughput check")
    ab.add_argument("--runs", type=int, default=5, help="runs per side (interleaved ABBA)")
    ab.add_argument("--alpha", type=float, default=0.05, help="significance level of the one-sided test")
    ab.add_argument("--min-effect", type=float, default=0.10,
                    help="the slowdown that may fail: the candidate is tested against the base x (1 - this)")
    ab.add_argument("--results", default="harness-results/ab")
    ab.add_argument("--specs", default=None)
    ab.add_argument("--engine-cmd", default=None)
    ab.add_argument("--candidate-env", action="append", default=[], metavar="KEY=VALUE",
                    help="extra environment of the candidate's runs (e.g. a planted fault hook)")
    ab.add_argument("--base-env", action="append", default=[], metavar="KEY=VALUE")

    gate = sub.add_parser("gate", help="CI gate: results + baselines -> pass/fail and a markdown summary")
    gate.add_argument("results")
    gate.add_argument("--baselines", default=str(BASELINES))
    gate.add_argument("--summary", default=None)
    gate.add_argument("--require-baselines", action="store_true")
    return p


def _engine_cmd(text: str | None) -> list[str] | None:
    return shlex.split(text) if text else None


def cmd_list(args: argparse.Namespace) -> int:
    from harness.spec import load_catalog

    for name, spec in load_catalog(args.specs).items():
        if args.family and spec.family != args.family:
            continue
        checks = ",".join(c.label for c in spec.checks)
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
    kwargs = {"engine_cmd": _engine_cmd(args.engine_cmd)}
    if args.executor == "docker":
        kwargs["image"] = args.image
    executor = make_executor(args.executor, **kwargs)
    cfg = HarnessConfig(executor=executor, results_dir=Path(args.results).resolve(),
                        baselines_dir=Path(args.baselines), require_baselines=args.require_baselines)
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
    from harness.recording import RecordError, record_baselines

    try:
        path, summary = record_baselines(args)
    except RecordError as exc:
        print(f"relax-harness: {exc}", file=sys.stderr)
        return 1
    print(summary)
    print(f"baselines written: {path}")
    return 0


def _env_pairs(items: list[str], flag: str) -> dict[str, str]:
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise SystemExit(f"relax-harness: {flag} {item!r}: expected KEY=VALUE")
        out[key] = value
    return out


def cmd_ab(args: argparse.Namespace) -> int:
    from harness.ab import ABConfig, ABError, run_ab
    from harness.report import write_html
    from harness.spec import load_catalog

    catalog = load_catalog(args.specs)
    if args.scenario not in catalog:
        print(f"relax-harness: unknown scenario {args.scenario!r}; see `relax-harness list`", file=sys.stderr)
        return 2
    results_dir = Path(args.results).resolve()
    cfg = ABConfig(base=args.base, spec=catalog[args.scenario], results_dir=results_dir, runs=args.runs,
                   alpha=args.alpha, min_effect=args.min_effect, engine_cmd=_engine_cmd(args.engine_cmd),
                   candidate_env=_env_pairs(args.candidate_env, "--candidate-env"),
                   base_env=_env_pairs(args.base_env, "--base-env"))
    print(f"A/B {args.scenario}: this checkout vs {args.base}, {args.runs} runs each, interleaved", flush=True)
    try:
        out = run_ab(cfg, log=lambda line: print(line, flush=True))
    except ABError as exc:
        print(f"relax-harness: A/B failed: {exc}", file=sys.stderr)
        return 1
    path = write_results(results_dir / "results.json", out["results"], ab=out["ab"])
    write_html(load_results(path), results_dir / "report.html")
    print(out["ab"]["verdict"])
    print(out["ab"]["statistic"])
    print(f"results: {path}  report: {results_dir / 'report.html'}")
    return 0 if out["ab"]["ok"] else 1


def cmd_gate(args: argparse.Namespace) -> int:
    from harness.gate import main as gate_main

    argv = [args.results, "--baselines", args.baselines]
    argv += ["--summary", args.summary] if args.summary else []
    argv += ["--require-baselines"] if args.require_baselines else []
    return gate_main(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handlers = {"run": cmd_run, "list": cmd_list, "report": cmd_report, "baseline": cmd_baseline, "ab": cmd_ab,
                "gate": cmd_gate}
    try:
        code = handlers[args.command](args)
        sys.stdout.flush()
        return code
    except (SpecError, ResultsError) as exc:
        print(f"relax-harness: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `relax-harness list | head`: the reader left; Python's recipe, stdout to devnull
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141  # 128 + SIGPIPE, as a shell reports a writer the pipe ended


if __name__ == "__main__":
    sys.exit(main())
