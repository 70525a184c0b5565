"""Same-machine A/B throughput gate: ``relax-harness ab --base REF`` (like ``asv continuous``).

The base commit is checked out in a temporary git worktree; each of its runs imports that worktree's
``relax`` (first on PYTHONPATH, checked before the first run), each candidate run imports this checkout's.
The candidate's scenario spec runs ``runs`` times on each side, interleaved in ABBA order so that drift
of the machine's load hits both sides alike, and the scenario's throughput figure (`harness.checks.throughput`)
of every run goes into the statistic of `harness.stats.decide`. A run that fails its scenario fails the A/B:
a broken candidate is no faster than anything.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.executors.local import LocalExecutor
from harness.results import ScenarioResult
from harness.runner import HarnessConfig, run_scenario
from harness.spec import ScenarioSpec
from harness.stats import decide

REPO = Path(__file__).resolve().parents[1]


class ABError(RuntimeError):
    """The A/B could not compare (a failed run, a bad ref, a checkout that imports the wrong code)."""


@dataclass
class ABConfig:
    base: str  # a git ref of ``repo``
    spec: ScenarioSpec
    results_dir: Path
    runs: int = 5
    alpha: float = 0.05
    min_effect: float = 0.10
    engine_cmd: list[str] | None = None
    candidate_env: dict[str, str] = field(default_factory=dict)
    base_env: dict[str, str] = field(default_factory=dict)
    repo: Path = REPO


@contextlib.contextmanager
def base_worktree(repo: Path, ref: str) -> Iterator[tuple[Path, str]]:
    """(a detached worktree of ``ref``, its commit); removed afterwards."""
    commit = _git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").strip()
    parent = Path(tempfile.mkdtemp(prefix="relax-ab-"))
    path = parent / "base"
    _git(repo, "worktree", "add", "--detach", str(path), commit)
    try:
        yield path, commit
    finally:
        with contextlib.suppress(ABError):
            _git(repo, "worktree", "remove", "--force", str(path))
        shutil.rmtree(parent, ignore_errors=True)
        with contextlib.suppress(ABError):
            _git(repo, "worktree", "prune")


def _git(repo: Path, *args: str) -> str:
    proc = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=120)
    if proc.returncode:
        raise ABError(f"git {' '.join(args)}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return proc.stdout


def check_imports(code_root: Path, env: dict[str, str]) -> None:
    """The runs of ``code_root`` must import its own ``relax`` and ``harness`` (not an installed copy)."""
    probe = "import harness, relax; print(relax.__file__); print(harness.__file__)"
    run_env = {**os.environ, **env, "PYTHONPATH": os.pathsep.join(p for p in (str(code_root),
                                                                               os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=run_env,
                          cwd=tempfile.gettempdir(), timeout=60)
    files = proc.stdout.split()
    root = code_root.resolve()
    if proc.returncode or len(files) != 2 or not all(Path(f).resolve().is_relative_to(root) for f in files):
        raise ABError(f"runs of {root} would import {files or proc.stderr.strip()[-300:]}, not that checkout's code")


def schedule(runs: int) -> list[str]:
    """ABBA order: candidate, base, base, candidate, candidate, base, ..."""
    pairs = [("candidate", "base") if i % 2 == 0 else ("base", "candidate") for i in range(runs)]
    return [side for pair in pairs for side in pair]


def run_ab(cfg: ABConfig, log=print) -> dict[str, Any]:
    """Run the A/B; returns the ``ab`` record (also the keys of the results JSON) and the run results."""
    if cfg.runs < 2:
        raise ABError(f"--runs {cfg.runs}: an A/B needs at least 2 runs a side")
    if not cfg.spec.measures_throughput:
        raise ABError(f"scenario {cfg.spec.name} has no throughput check: nothing to compare")
    with base_worktree(cfg.repo, cfg.base) as (worktree, commit):
        roots = {"candidate": cfg.repo, "base": worktree}
        envs = {"candidate": cfg.candidate_env, "base": cfg.base_env}
        for side, root in roots.items():
            check_imports(root, envs[side])
        records, results = [], []
        counters = {"candidate": 0, "base": 0}
        for order, side in enumerate(schedule(cfg.runs), start=1):
            counters[side] += 1
            spec = cfg.spec.with_overrides(env={**cfg.spec.env, **envs[side]})
            hc = HarnessConfig(executor=LocalExecutor(cfg.engine_cmd, code_root=roots[side]),
                               results_dir=cfg.results_dir / f"{side}-{counters[side]}")
            res = run_scenario(spec, hc)
            res.name = f"{spec.name}[{side} {counters[side]}]"
            results.append(res)
            value = _throughput(res)
            if res.failures() or value is None:
                why = (res.failures() or ["no throughput measured"])[0]
                raise ABError(f"{side} run {counters[side]} of {spec.name} failed: {why} (log: {res.runs[-1].log_path})")
            records.append({"side": side, "order": order, "value": value})
            log(f"  {order:>2}. {side:<9} {value:.4g} {_metric(res)}")
    verdict = decide([r["value"] for r in records if r["side"] == "candidate"],
                     [r["value"] for r in records if r["side"] == "base"], cfg.alpha, cfg.min_effect)
    metric = _metric(results[0])
    medians = {side: statistics.median(r["value"] for r in records if r["side"] == side) for side in envs}
    text = (f"candidate {'PASS' if verdict.ok else 'FAIL'}: median {metric} {medians['candidate']:.4g} vs "
            f"{medians['base']:.4g} for base {cfg.base} ({commit[:12]}), {-verdict.slowdown:+.1%}")
    ab = {"scenario": cfg.spec.name, "base": cfg.base, "base_commit": commit, "metric": metric, "runs": records,
          "ok": verdict.ok, "p": verdict.p, "u": verdict.u, "slowdown": verdict.slowdown, "alpha": cfg.alpha,
          "min_effect": cfg.min_effect, "statistic": verdict.statistic(), "verdict": text}
    return {"ab": ab, "results": results}


def _throughput(res: ScenarioResult) -> float | None:
    for c in res.checks:
        if c.kind == "throughput" and "value" in c.measurements:
            return float(c.measurements["value"])
    return None


def _metric(res: ScenarioResult) -> str:
    return next((c.measurements.get("metric", "") for c in res.checks if c.kind == "throughput"), "")
