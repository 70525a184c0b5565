"""CI gate: a results JSON + the baselines dir -> pass/fail with reasons and a markdown summary.

Scenario failures fail the gate; an xfailed scenario (a feature that waits for an issue) does not, an
xpassed one does (remove its xfail); a skipped one is listed as skipped. Throughput is re-judged here
against the baselines given on the command line, from the measurements stored in the results, with the
same rule as the check (`harness.baselines.judge`, the check's own minimum tolerance). A machine class
without a baseline is listed as "no baseline for <class>", and fails only with ``--require-baselines``.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness import baselines
from harness.report.terminal import outcome


@dataclass
class Verdict:
    ok: bool = True
    rows: list[tuple[str, str, str]] = field(default_factory=list)
    reasons: list[str] = field(default_factory=list)
    throughput: list[str] = field(default_factory=list)
    no_baseline: list[str] = field(default_factory=list)

    def fail(self, reason: str) -> None:
        self.ok = False
        self.reasons.append(reason)


def _throughput(sc: dict[str, Any], directory: Path, require: bool, verdict: Verdict) -> str:
    """Re-judge the scenario's throughput; returns its row's result word."""
    word = "passed"
    for check in sc.get("checks", []):
        m = check.get("measurements") or {}
        if check.get("kind") != "throughput" or "value" not in m:
            continue
        machine, key = sc.get("machine_class", ""), m.get("baseline_key") or sc["name"]
        base = baselines.entry(directory, machine, key)
        missing = baselines.missing_reason(base, machine, key, m.get("spec"))
        if missing:
            verdict.no_baseline.append(f"{sc['name']}: {m['value']:.4g} {m['metric']}; {missing}")
            if require:
                verdict.fail(f"{sc['name']}: {missing} (--require-baselines)")
                word = "failed"
            elif word == "passed":
                word = "no baseline"
            continue
        judged = baselines.judge(float(m["value"]), base, float(m["min_tolerance"]))
        line = judged.line(m["metric"], float(m["value"]))
        verdict.throughput.append(f"{sc['name']}: {line}")
        if not judged.ok:
            verdict.fail(f"{sc['name']}: throughput regression: {line}")
            word = "failed"
    return word


def judge(results: dict[str, Any], directory: Path, require_baselines: bool = False) -> Verdict:
    verdict = Verdict()
    scenarios = results.get("scenarios", [])
    if not scenarios:
        verdict.fail("no scenario results (did the suite run?)")
    for sc in scenarios:
        out = outcome(sc)
        reason = (sc.get("test") or {}).get("reason")
        message = sc.get("message", "")
        if out == "xfailed":
            verdict.rows.append((sc["name"], "xfailed (expected)", reason or message))
            continue
        if out == "skipped":
            verdict.rows.append((sc["name"], "skipped", reason or message))
            continue
        if out in ("failed", "unsupported", "xpassed"):
            why = "passed although marked xfail: remove the marker" if out == "xpassed" else message
            verdict.fail(f"{sc['name']}: {why}")
            verdict.rows.append((sc["name"], out, why))
            continue
        verdict.rows.append((sc["name"], _throughput(sc, directory, require_baselines, verdict), message))
    return verdict


def markdown(verdict: Verdict) -> str:
    esc = lambda s: str(s).replace("|", "\\|").replace("\n", " ")[:300]  # noqa: E731
    lines = [f"## relax scenario gate: {'PASS' if verdict.ok else 'FAIL'}", "",
             "| scenario | result | detail |", "| --- | --- | --- |"]
    lines += [f"| {esc(n)} | {esc(r)} | {esc(d)} |" for n, r, d in verdict.rows]
    if verdict.reasons:
        lines += ["", "### Failures", *[f"- {esc(r)}" for r in verdict.reasons]]
    if verdict.throughput:
        lines += ["", "### Throughput", *[f"- {esc(t)}" for t in verdict.throughput]]
    if verdict.no_baseline:
        lines += ["", "### Throughput without a baseline (not judged)", *[f"- {esc(t)}" for t in verdict.no_baseline]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from harness.results import ResultsError, load_results

    p = argparse.ArgumentParser(prog="python -m ci.gate")
    p.add_argument("results")
    p.add_argument("--baselines", default=str(Path(__file__).resolve().parents[1] / "ci" / "baselines"))
    p.add_argument("--summary", default=None, help="also append the markdown here (e.g. $GITHUB_STEP_SUMMARY)")
    p.add_argument("--require-baselines", action="store_true", help="a missing baseline fails the gate")
    args = p.parse_args(argv)
    try:
        data = load_results(Path(args.results))
    except ResultsError as exc:
        print(f"gate: {exc}", file=sys.stderr)
        return 2
    verdict = judge(data, Path(args.baselines), args.require_baselines)
    text = markdown(verdict)
    print(text)
    if args.summary:
        with open(args.summary, "a", encoding="utf-8") as fh:
            fh.write(text)
    return 0 if verdict.ok else 1


if __name__ == "__main__":
    sys.exit(main())
